"""Config, manifest, hashing, paths and environment: no heavy imports here."""
