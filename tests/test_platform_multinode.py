"""A sweep on a 2-node Ray cluster simulated on this machine, with checkpoints on shared storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._platform import read_sweep, run_sweep, write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster            # the platform connects itself (--address), as the CLI would
    ray.shutdown()
    cluster.shutdown()


def test_sweep_on_two_nodes_needs_and_uses_shared_storage(two_nodes, tmp_path: Path) -> None:
    import ray

    tiny = make_tiny_prepared(tmp_path / "data")
    request = dict(dataset="cbt-ne", data=tiny, num_samples=2, search_space=write_space(tmp_path),
                   sets=TINY_SETS, workdir=tmp_path / "work", name="multi", address=two_nodes.address,
                   show_progress=False)
    with pytest.raises(ValueError, match="`storage_path` is required"):
        run_sweep(**request)

    shared = tmp_path / "shared"
    result = run_sweep(**request, storage_path=str(shared))
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    sweep = read_sweep(tmp_path / "work", "multi")
    assert [t["status"] for t in sweep["trials"]] == ["TERMINATED", "TERMINATED"]
    for trial in sweep["trials"]:   # checkpoints live on the shared storage path
        assert Path(trial["checkpoint"]).is_file() and shared in Path(trial["checkpoint"]).parents
    assert Path(result["best_config"]).is_file()
