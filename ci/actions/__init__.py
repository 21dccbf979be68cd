"""Running the generated workflows under act (`python -m ci actions`)."""
