"""Stand-in for the one name `streaming.vision` imports at import time."""


class VisionDataset:
    """Never instantiated by the text benchmark."""
