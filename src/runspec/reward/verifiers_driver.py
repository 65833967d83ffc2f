"""miles' driver for a verifiers environment (the `verifiers` env kind, docs/agents.md
"Verifiers environments"). `miles run` starts it as a `rollout_program`, once per group:

    PYTHON -c DRIVER MODULE ARGS_JSON

with `{"task": ROW, "sessions": [{"id", "base_url"}, ...]}` on stdin. It loads the environment
(verifiers 0.4, `verifiers.v1`: MODULE is the taskset's package, ARGS_JSON the env config's
other fields, e.g. {"taskset": {"size": 8}}), picks the task ROW names, plays one episode of it
per session with the model behind that session's OpenAI-compatible base_url (the harness and
the tool servers are the environment's own), and prints `{"rewards": [...], "metrics": [...]}`:
each episode's weighted reward as the environment's rubric scored it, and the rubric's parts
(`scores`). A harness's PEP 723 program runs with this Python when it has the program's
dependencies (`run_scripts_here`). An episode that failed is a fault of the group: its errors
go to stderr and the driver exits 1 (the stage's `on_env_error` decides).
"""

import asyncio
import hashlib
import json
import math
import os
import re
import sys
import tempfile


def fail(message):
    print(f"verifiers driver: {message}", file=sys.stderr)
    sys.exit(1)


def pick_task(env, row):
    """The task ROW names: the taskset's task at position `idx` (a field of the row), else the
    one whose `id` is the row's `id`, else a task built from the row's fields (the prompt, the
    label as `label`, the other fields as they are) by the taskset's own task type."""
    meta = row.get("metadata") or {}
    if "idx" in meta or "id" in meta:
        key, want = ("idx", int(meta["idx"])) if "idx" in meta else ("id", str(meta["id"]))
        for task in env.taskset:
            if getattr(task.data, key) == want:
                return task
        fail(f"the taskset `{env.config.taskset.id}` has no task with {key} {want!r}")
    task_cls = type(env.taskset).task_type()
    fields = dict(meta)
    if row.get("prompt") is not None:
        fields["prompt"] = row["prompt"]
    if row.get("label") is not None:
        fields.setdefault("label", row["label"])
    data = task_cls.data_type().model_validate(fields)
    return task_cls(data, env.taskset.config.task)


def script_needs(data):
    """The `requires-python` and `dependencies` of a PEP 723 script's `# /// script` block, or
    None where it has none or cannot be read (then uv prepares it, as verifiers would)."""
    try:
        import tomllib
    except ImportError:
        return None
    block, inside = [], False
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip() == "# /// script":
            inside = True
        elif inside and line.strip() == "# ///":
            try:
                meta = tomllib.loads("\n".join(block))
            except tomllib.TOMLDecodeError:
                return None
            return meta.get("requires-python"), meta.get("dependencies", [])
        elif inside:
            block.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return None


def satisfied_here(data):
    """Whether this Python already has what the script declares: its version in
    `requires-python`, every dependency installed at a version its specifier allows."""
    needs = script_needs(data)
    if needs is None:
        return False
    try:
        from importlib.metadata import PackageNotFoundError, version
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
    except ImportError:
        return False
    python, deps = needs
    here = ".".join(map(str, sys.version_info[:3]))
    try:
        if python and here not in SpecifierSet(python):
            return False
        for dep in deps:
            req = Requirement(dep)
            if req.marker is not None and not req.marker.evaluate():
                continue
            # An extra's own dependencies are not checked here: uv resolves those.
            if req.extras or not req.specifier.contains(version(req.name), prereleases=True):
                return False
    except (InvalidRequirement, InvalidSpecifier, PackageNotFoundError):
        return False
    return True


def run_scripts_here():
    """A verifiers harness runs its chat program as a PEP 723 script that the runtime prepares
    with `uv sync --script`, which asks the package index every time. miles plays on this
    machine (the subprocess runtime) with verifiers' own Python, which has the program's
    dependencies already (they are verifiers' own): such a script runs here, with no index
    and no network. A script that needs what this Python lacks still goes through uv."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    prepare_with_uv = SubprocessRuntime.prepare_uv_script

    async def prepare(self, script, env=None, *, activate=True):
        data = script.encode() if isinstance(script, str) else script
        if not satisfied_here(data):
            return await prepare_with_uv(self, script, env, activate=activate)
        # Content-addressed and renamed into place, so concurrent rollouts share one file and
        # never run a half-written one.
        directory = os.path.join(self.scripts_dir, "miles")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, hashlib.sha256(data).hexdigest() + ".py")
        if not os.path.exists(path):
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return [sys.executable, path]

    SubprocessRuntime.prepare_uv_script = prepare


# What miles takes as a metric name (`agent/<name>` columns, docs/agents.md), and how many.
METRIC_NAME = re.compile(r"[^A-Za-z0-9_.\-/]")
MAX_METRICS = 32


def scores(episode):
    """An episode's rubric, as miles metrics: `reward/NAME`, each reward's weighted value summed
    over the episode's traces (they add up to its reward), and each `@vf.metric` as its mean
    over the traces that recorded it. Scoring that did not run (`None`) is left out."""
    rewards, metrics = {}, {}
    for t in episode.traces:
        for name, r in t.rewards.items():
            if r is not None:
                key = METRIC_NAME.sub("_", f"reward/{name}")[:64]
                rewards[key] = rewards.get(key, 0.0) + r.value
        for name, x in t.metrics.items():
            if x is not None:
                metrics.setdefault(METRIC_NAME.sub("_", name)[:64], []).append(x)
    out = dict(rewards)
    out.update({k: sum(v) / len(v) for k, v in metrics.items() if k not in out})
    # An empty name or a value that is not a finite number would make miles refuse the answer.
    out = {k: float(v) for k, v in sorted(out.items()) if k and math.isfinite(v)}
    return dict(list(out.items())[:MAX_METRICS])


def served_model(base_url, key):
    """The model name the session server lists (requests must name a served model)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30.0)
    return client.models.list().data[0].id


async def play(env, task, sessions, model):
    import verifiers.v1 as vf

    async with env.serving():
        runs = []
        for session in sessions:
            client = vf.EvalClientConfig(base_url=session["base_url"], api_key_var="OPENAI_API_KEY")
            ctx = vf.ModelContext(model=model, client=client)
            runs.append(env.run_slot(env.slots(task)[0], ctx))
        return await asyncio.gather(*runs)


def main():
    if len(sys.argv) != 3:
        fail("usage: python -c DRIVER MODULE ARGS_JSON")
    module, args = sys.argv[1], sys.argv[2]
    try:
        config = json.loads(args)
    except json.JSONDecodeError as e:
        fail(f"`args` is not JSON: {e}")
    if not isinstance(config, dict):
        fail("`args` must be a JSON object (the env config's fields)")
    request = json.loads(sys.stdin.readline())
    sessions = request["sessions"]
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        fail(f"cannot import verifiers.v1 in {sys.executable} ({e}): pip install verifiers==0.4.0")
    # The environment's harness runs its chat program with uv; the one beside this Python first.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    config.setdefault("taskset", {})["id"] = module
    # verifiers' default seat runs in Prime's cloud; miles plays on this machine unless `args`
    # names another runtime (a multi-agent env names its own seats in `args`).
    if not config.get("id"):
        agent = config.setdefault("agent", {})
        agent.setdefault("runtime", {"type": "subprocess"})
    run_scripts_here()
    env = vf.load_environment(vf.resolve_env_config(config))
    task = pick_task(env, request["task"])
    model = served_model(sessions[0]["base_url"], os.environ.get("OPENAI_API_KEY", "EMPTY"))
    episodes = asyncio.run(play(env, task, sessions, model))
    failed = [e for e in episodes if not e.ok]
    if failed:
        for e in failed:
            for err in e.errors:
                print(f"{err.type}: {err.message}", file=sys.stderr)
            for t in e.traces:
                for err in t.errors:
                    print(f"{err.type}: {err.message}", file=sys.stderr)
        fail(f"{len(failed)} of {len(episodes)} episodes failed")
    print(json.dumps({"rewards": [sum(t.reward for t in e.traces) for e in episodes], "metrics": [scores(e) for e in episodes]}))


# `python -c DRIVER` runs it as `__main__`; a test may import its functions.
if __name__ == "__main__":
    main()
