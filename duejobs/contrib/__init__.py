"""Integrations with frameworks; each is optional and imports its framework only when used."""
