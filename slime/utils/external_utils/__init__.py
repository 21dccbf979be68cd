"""Helpers shared by the GPU end-to-end tests (`command_utils`, imported as `U`)."""
