"""python -m minskill.serve --model SPEC [--port 8000] ...: the OpenAI-compatible server
(minskill/serve/server.py)."""
import sys

from minskill.serve.server import main

if __name__ == "__main__":
    sys.exit(main())
