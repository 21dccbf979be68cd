"""GitHub Actions: the job table and what each event runs (`job_plan`), the generated
workflows and their drift check (`workflow`, `gateway_workflow`, `yaml_writer`, all built
from `job_builder`'s pieces), and the comment gateway (`gateway`, `comment_commands`,
`comment_reply`, `teams`)."""
