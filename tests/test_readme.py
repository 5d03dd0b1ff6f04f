"""The README's front-door commands are the ones CI and users really run."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_commands():
    with open(os.path.join(ROOT, "README.md")) as handle:
        text = handle.read()
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
    commands = _readme_commands()
    assert len(commands) >= 2, "README must open with the main-job and the test command"
    test_command = commands[1].strip()
    assert "pytest" in test_command
    with open(os.path.join(ROOT, ".ci", "run")) as handle:
        ci_lines = [line.strip() for line in handle]
    assert test_command in ci_lines


def test_main_job_command_runs_an_existing_example():
    main_command = _readme_commands()[0]
    scripts = re.findall(r"python3 (examples/\S+\.py)", main_command)
    assert scripts and all(os.path.exists(os.path.join(ROOT, s)) for s in scripts)
