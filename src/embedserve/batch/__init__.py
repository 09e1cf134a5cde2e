"""Batch jobs in OpenAI's batch file format (`embedserve run-batch`): format.py reads input lines
and writes output / error lines, resume.py finds what a previous run wrote, runner.py runs a window
of lines in input order, execute.py answers a line in-process or over HTTP."""
