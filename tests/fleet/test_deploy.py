"""The deploy files of a plan: one `vllm serve` per replica, `docker run`, and Kubernetes
manifests that parse, with the args as a list, GPU requests and a /health probe."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.fleet.deploy import FILL_ME, check_manifests, serve_args, write_deploy
from tests.vllm_serve_parser import NO_VLLM, VLLM_PYTHON, parse_serve_args

CONFIG = TrialConfig(
    model="qwen3.6-27b-awq",
    flags={
        "max-model-len": 40960,
        "kv-cache-memory-bytes": 25501368320,
        "enable-prefix-caching": True,
        "max-num-seqs": 32,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 2},
    },
)


def test_the_files_deploy_every_replica_with_the_args_as_a_list(tmp_path: Path) -> None:
    written = write_deploy(
        tmp_path, CONFIG, model="/data/Qwen3.6-27B-AWQ", replicas=3, tp=2, name="vllm-h100"
    )
    assert [p.name for p in written] == ["serve.sh", "docker-run.sh", "kubernetes.yaml"]
    lines = (tmp_path / "serve.sh").read_text().splitlines()
    serve = [line for line in lines if line.startswith("CUDA_VISIBLE_DEVICES=")]
    assert len(serve) == 3
    assert serve[2].startswith("CUDA_VISIBLE_DEVICES=4,5 vllm serve /data/Qwen3.6-27B-AWQ ")
    argv = shlex.split(serve[2].split(" ", 1)[1].rstrip(" &"))
    assert argv[argv.index("--port") + 1] == "8002" and "--host" in argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "mtp"
    docker = (tmp_path / "docker-run.sh").read_text()
    assert docker.count("docker run") == 3 and "-p 127.0.0.1:8001:8000" in docker
    assert "/models/Qwen3.6-27B-AWQ" in docker
    deployment, service = check_manifests((tmp_path / "kubernetes.yaml").read_text())
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["args"][:3] == ["/models/Qwen3.6-27B-AWQ", "--max-model-len", "40960"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert FILL_ME in pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_a_config_with_lmcache_says_its_servers_need_the_package(tmp_path: Path) -> None:
    """Before: the files launched LMCacheMPConnector on an image that may lack lmcache,
    and said nothing."""
    lmcache = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both"}
    with_lmcache = CONFIG.model_copy(
        update={"flags": {**CONFIG.flags, "kv-transfer-config": lmcache}}
    )
    write_deploy(tmp_path / "on", with_lmcache, model="m", replicas=1, tp=1, name="vllm-x")
    write_deploy(tmp_path / "off", CONFIG, model="m", replicas=1, tp=1, name="vllm-x")
    for file_name in ("serve.sh", "docker-run.sh", "kubernetes.yaml"):
        assert "needs the lmcache package" in (tmp_path / "on" / file_name).read_text()
        assert "lmcache" not in (tmp_path / "off" / file_name).read_text().lower()
    check_manifests((tmp_path / "on" / "kubernetes.yaml").read_text())


def test_a_flag_vllm_does_not_take_is_refused_by_name() -> None:
    bad = CONFIG.model_copy(update={"flags": {**CONFIG.flags, "max-num-seq": 8}})
    with pytest.raises(InputError, match="max-num-seq"):
        serve_args(bad, "m")


def test_manifests_missing_the_probe_are_refused() -> None:
    text = yaml.safe_dump_all([{"kind": "Service"}])
    with pytest.raises(InputError, match="not a Deployment and a Service"):
        check_manifests(text)


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=NO_VLLM)
def test_vllm_parses_the_serve_args(tmp_path: Path) -> None:
    args = serve_args(CONFIG, "Qwen/Qwen3-0.6B")
    parsed = parse_serve_args(args, tmp_path)
    assert parsed["max_model_len"] == 40960 and parsed["max_num_seqs"] == 32


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "b200"], "unknown hardware 'b200'"),
        (["--gpu", "h100-80g", "--speedup", "2"], "one of --sessions N, --speedup X, --rate"),
        (["--gpu", "h100-80g", "--tp", "16"], "one node of at most 8 GPUs"),
        (["--gpu", "h100-80g", "--price", "h100=free"], "expected GPU=USD_PER_HOUR"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    workload = Path(__file__).parents[2] / "workloads" / "sample-claudecode.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "plan", str(workload), "--model", "qwen3.6-27b-awq",
         "--sessions", "4", "--slo", "ttft_p95<=3s", "--out", str(tmp_path), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "plan.json").exists()
