"""Stand-in torchvision for `import streaming` (see ../README.md); nothing here is used."""
