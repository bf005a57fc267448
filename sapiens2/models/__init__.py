"""The models: the zoo (sizes, checkpoints), where weights are, how they load, the networks (nn/)."""
