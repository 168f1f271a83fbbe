"""The results folder's safety: atomic writes, one owner, damage and trust checks."""
