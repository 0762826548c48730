"""Bridges to other projects' evaluators. Each submodule imports its project only when used, and
nothing else in cosmos3-gym imports these submodules."""
