"""Web tools for the tool-using agent of `web:` suites (minskill/tasks/webagent.py): search, page
visits over HTTP and a task's own file (tools.py), HTML read as text with numbered links
(page_text.py), the agent's calls through OpenAI's `tools` field or as ReAct text (agent_calls.py).

Importing this package hands the tools to the web suites' environments (tasks.webagent.use_toolbox),
each episode with the settings the environment's MINSKILL_* variables give then (tools.WebSettings);
the scripts import it through minskill.rollout."""
from minskill.tasks.webagent import use_toolbox

from .agent_calls import ToolCalls
from .tools import WebSettings, WebTools, add_web_args

__all__ = ["ToolCalls", "WebSettings", "WebTools", "add_web_args"]

use_toolbox(WebTools.from_environ)
