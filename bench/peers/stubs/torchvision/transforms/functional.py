"""Stand-in for the one name `streaming.vision` imports at import time."""


def to_tensor(picture):
    raise NotImplementedError("torchvision stub: the peers benchmark reads no images")
