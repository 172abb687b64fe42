"""Dataset readers, locating and verified downloads."""
