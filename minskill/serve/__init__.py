"""The frozen task model behind HTTP: an OpenAI-compatible server over a minskill model (`python -m
minskill.serve`), the client every script calls it (or any other endpoint) with, and the client's
call cache."""
