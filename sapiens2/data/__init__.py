"""Label definitions: the 308 keypoints and the 29 body-part classes (JSON), read by metadata."""
