"""The files that deploy a planned fleet: `vllm serve` per replica, `docker run`, and a
Kubernetes Deployment + Service, each with the config's args as one list.

The args are checked against `vllm serve`'s flag names (vLLM's own parser's list,
``config/known_flags.py``; tests/fleet/test_deploy.py parses them with vLLM's parser where
a vLLM venv exists) and the manifests are parsed back before they are written.
Servers listen on 127.0.0.1 on a host; in a container on 0.0.0.0 (the container's port
is published on 127.0.0.1 by docker, behind the Service in Kubernetes).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from autotune.config.known_flags import VLLM_FLAGS_VERSION, vllm_flags
from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError

PORT = 8000
IMAGE = f"vllm/vllm-openai:v{VLLM_FLAGS_VERSION}"
MODEL_MOUNT = "/models"
FILL_ME = "FILL-ME"  # what the user replaces: the model volume
ROUTER_NOTE = (
    "the plan routes sessions round robin (session k -> replica k mod R, all its requests "
    "with it); put a session-aware router in front (hash of a session header), or the "
    "Service's ClientIP affinity for one client per session"
)


LMCACHE_NOTE = (
    "this config uses LMCache (--kv-transfer-config LMCacheMPConnector): the server needs "
    "the lmcache package beside vllm (pip install lmcache; check that the image has it)"
)


def notes(args: list[str]) -> list[str]:
    """What the deploy files say above the servers: what their environment must hold."""
    return [LMCACHE_NOTE] if any("LMCache" in arg for arg in args) else []


def serve_args(config: TrialConfig, model: str) -> list[str]:
    """The `vllm serve` argv tail for ``model`` (a path or id): model first, then the flags.

    Raises InputError naming a flag `vllm serve` does not take."""
    flags = vllm_flags()
    for name in config.flags:
        problem = flags.problem(name)
        if problem is not None:
            raise InputError(f"deploy: {problem}")
    return [model, *config.vllm_args()[1:]]


def in_container(args: list[str]) -> list[str]:
    """``args`` with a local model path moved under the container's model mount."""
    model = args[0]
    if model.startswith(("/", ".", "~")):
        return [f"{MODEL_MOUNT}/{Path(model).name}", *args[1:]]
    return args


def serve_script(args: list[str], replicas: int, tp: int) -> str:
    """One `vllm serve` per replica on this host, each on its own GPUs and port."""
    lines = ["#!/bin/sh", "# autotune plan: one vllm serve per replica (GPUs, port).",
             *(f"# {note}." for note in notes(args)), "set -e"]  # fmt: skip
    for replica in range(replicas):
        gpus = ",".join(str(replica * tp + i) for i in range(tp))
        argv = ["vllm", "serve", *args, "--host", "127.0.0.1", "--port", str(PORT + replica)]
        lines.append(f"CUDA_VISIBLE_DEVICES={gpus} {shlex.join(argv)} &")
    lines += ["wait", ""]
    return "\n".join(lines)


def docker_script(args: list[str], replicas: int, tp: int) -> str:
    """One `docker run` per replica; the model folder is the one to fill in."""
    lines = ["#!/bin/sh", "# autotune plan: set MODELS to the folder that holds the model.",
             *(f"# {note}." for note in notes(args)),
             f"MODELS=${{MODELS:-/path/to/{FILL_ME}-models}}", "set -e"]  # fmt: skip
    args = in_container(args)
    for replica in range(replicas):
        gpus = ",".join(str(replica * tp + i) for i in range(tp))
        argv = [
            "docker", "run", "-d", "--name", f"vllm-{replica}",
            "--gpus", f'"device={gpus}"', "--ipc=host",
            "-p", f"127.0.0.1:{PORT + replica}:{PORT}",
            "-v", f"$MODELS:{MODEL_MOUNT}", IMAGE,
            *args, "--host", "0.0.0.0", "--port", str(PORT),
        ]  # fmt: skip
        lines.append(" ".join(shlex.quote(a) if not a.startswith("$") else f'"{a}"' for a in argv))
    lines.append("")
    return "\n".join(lines)


def kubernetes_manifests(args: list[str], replicas: int, tp: int, name: str) -> list[dict]:
    """A Deployment of ``replicas`` pods of ``tp`` GPUs each, and its Service."""
    labels = {"app": name}
    container = {
        "name": "vllm",
        "image": IMAGE,
        "command": ["vllm", "serve"],
        "args": [*in_container(args), "--host", "0.0.0.0", "--port", str(PORT)],
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": tp}, "requests": {"nvidia.com/gpu": tp}},
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": PORT},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "failureThreshold": 60,
        },
        "volumeMounts": [
            {"name": "model", "mountPath": MODEL_MOUNT},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "model",
                            "persistentVolumeClaim": {"claimName": f"{FILL_ME}-model-pvc"},
                        },
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "selector": dict(labels),
            "ports": [{"port": PORT, "targetPort": PORT, "name": "http"}],
            "sessionAffinity": "ClientIP",
        },
    }
    return [deployment, service]


def check_manifests(text: str) -> list[dict[str, Any]]:
    """The manifests parsed back; InputError when one lacks what a cluster needs."""
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    kinds = [doc.get("kind") for doc in documents]
    if kinds != ["Deployment", "Service"]:
        raise InputError(f"deploy: the manifests hold {kinds}, not a Deployment and a Service")
    container = documents[0]["spec"]["template"]["spec"]["containers"][0]
    if not all(isinstance(arg, str) for arg in container["args"]):
        raise InputError("deploy: the container's args are not a list of strings")
    if container["readinessProbe"]["httpGet"]["path"] != "/health":
        raise InputError("deploy: the readiness probe is not on /health")
    return documents


def write_deploy(
    out: Path, config: TrialConfig, *, model: str, replicas: int, tp: int, name: str
) -> list[Path]:
    """Write serve.sh, docker-run.sh and kubernetes.yaml for the fleet into ``out``."""
    args = serve_args(config, model)
    out.mkdir(parents=True, exist_ok=True)
    manifests = kubernetes_manifests(args, replicas, tp, name)
    text = f"# autotune plan: {replicas} replica(s) of {tp} GPU(s).\n# Router: {ROUTER_NOTE}.\n"
    text += f"# Fill in the model volume ({FILL_ME}-model-pvc) before applying.\n"
    text += "".join(f"# {note}.\n" for note in notes(args))
    text += yaml.safe_dump_all(manifests, sort_keys=False)
    check_manifests(text)
    written = {
        "serve.sh": serve_script(args, replicas, tp),
        "docker-run.sh": docker_script(args, replicas, tp),
        "kubernetes.yaml": text,
    }
    paths = []
    for file_name, content in written.items():
        path = out / file_name
        path.write_text(content)
        if file_name.endswith(".sh"):
            path.chmod(0o755)
        paths.append(path)
    return paths
