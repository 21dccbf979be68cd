"""The run command (`python -m ci run`, what every nox session does) as a pipeline.

select → acquire → run → judge → report → record: `command` parses the command line and
calls the stages of `pipeline` in order; `runner` runs selected entries on job slots
through a backend (`ci.backends`); `report` writes JUnit, the table and the step summary;
`timeline` draws the GPU run. The history, its gates and quarantine and the timeline
observe the run through `ci.history.run_observer`.
"""
