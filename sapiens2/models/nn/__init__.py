"""Networks: the Sapiens2 backbone, the task heads and the task model that joins them."""
