"""What comes in: image intake (hostile files -> upright RGB), the network input, the person detector."""
