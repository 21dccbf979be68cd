"""The run command (`python -m ci run`, what every nox session does) as a pipeline.

plan → acquire → run → judge → report → record: `command` parses and wires the stages;
`runner` runs planned entries on job slots through a backend (`ci.backends`); `report`
writes JUnit, the table and the step summary; `timeline` draws the GPU run.
"""
