"""A scripted agent that plays each task's oracle plan over HTTP: does a multi-turn suite's every
game reach `won` through the path a model's replies take (the server, the agent prompt, the action
parser, the engine)?

    python -m minskill.measure.oracle_agent --suite alfworld --split heldout --n-tasks 60 \\
        --out runs/alfworld-oracle

For ALFWorld the plan is the engine's own planner's walkthrough (tasks.alfworld.oracle_actions); the
other suites have theirs (tasks.ORACLES). A game the oracle loses here is a defect of the game, the
prompt or the parser, not of a model. Steps:

1. the tasks, as `python -m minskill.rollout` loads them from the same flags;
2. each task's environment is reset once: its first observation names the episode, as it opens the
   first user message of every request of that episode;
3. a ScriptedBackend on 127.0.0.1 answers the t-th request of an episode (t = 0, 1, ...) with
   plan[t], and "look" after the plan's end (a loss, then, counted as such);
4. `python -m minskill.rollout --skills none --task-url <it>` runs against it with every other flag
   given here, and prints the per-type table (success with its Wilson interval, NHR, steps).

It ends with the games won out of those played (OUT/summary.json, all of the run's games, resumed
ones included); the exit status is 1 when one was lost, so that a script can check a suite with it.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from minskill import rollout
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.tasks import load_suite, make_env, oracle_actions

REFUSED = ("--task-url", "--skills", "--n", "--temperature")   # what this tool sets itself


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = rollout._parser()
    parser.prog = "python -m minskill.measure.oracle_agent"
    parser.description = __doc__.split("\n\n")[0]
    args = parser.parse_args(argv)
    for flag in REFUSED:   # (read from the parsed flags: argparse takes abbreviations too)
        dest = flag[2:].replace("-", "_")
        if getattr(args, dest) != parser.get_default(dest):
            parser.error(f"{flag} is set by the oracle agent itself (--skills none, its own "
                         "server, one greedy rollout a task)")
    try:
        tasks = load_suite(args.suite, split=args.split, seed=args.task_seed, n=args.n_tasks)
        agent = OracleAgent(tasks)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    if args.out is None:
        args.out = f"runs/oracle-{args.suite}-{time.strftime('%Y%m%d-%H%M%S')}"
        argv += ["--out", args.out]
    with start_server(ScriptedBackend(agent, name="oracle", max_context=1_000_000)) as server:
        code = rollout.main(argv + ["--skills", "none", "--task-url", server.url,
                                    "--task-model", "oracle"])
    if code:
        return code
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    won = round(summary["success_rate"] * summary["n"])
    print(f"oracle agent: {won} of {summary['n']} games won through HTTP")
    return int(won < summary["n"])


class OracleAgent:
    """`fn(messages, request)` of a ScriptedBackend: the next action of the episode whose first
    observation opens the request's first user message."""

    def __init__(self, tasks: list):
        multi = [t for t in tasks if t.multi_turn]
        if not multi:
            raise ValueError("the oracle agent plays multi-turn suites (alfworld, household, "
                             "webwalk, webshop, searchqa, ...): these tasks are single-turn")
        self.plans, self.first_observations, self.asked = {}, {}, {}
        self.lock = threading.Lock()
        for task in multi:
            env = make_env(task)
            try:
                first = env.reset()
            finally:
                getattr(env, "close", lambda: None)()
            if first in self.first_observations.values():
                raise ValueError(f"task {task.id}: its first observation is another task's, so "
                                 "the oracle cannot tell their episodes apart")
            self.first_observations[task.id], self.plans[task.id] = first, oracle_actions(task)

    def __call__(self, messages: list[dict], request) -> str:
        first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
        task_id = next((i for i, first in self.first_observations.items() if first in first_user),
                       None)
        if task_id is None:
            raise ValueError(f"a request whose first user message opens no known episode: "
                             f"{first_user[:200]!r}")
        with self.lock:
            step = self.asked.get(task_id, 0)
            self.asked[task_id] = step + 1
        plan = self.plans[task_id]
        return plan[step] if step < len(plan) else "look"


if __name__ == "__main__":
    sys.exit(main())
