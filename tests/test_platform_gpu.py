"""GPU workers without a GPU: resource plans, device choice and process-group backend (no Ray started)."""

from __future__ import annotations

import pytest
import torch

from iaa.errors import IaaError
from iaa.platform.cluster import connect as cluster, resources
from iaa.platform.cluster.connect import ClusterInfo
from iaa.platform.cluster.resources import DRIVER_CPU, DRIVER_RESOURCE, Node
from iaa.platform.ray_train import process_group_backend

pytestmark = pytest.mark.timeout(60)

GPU_NODES = (Node("head", cpus=8, driver=100), Node("g1", cpus=8, gpus=1), Node("g2", cpus=32, gpus=4))


def test_fractional_gpus_with_several_workers_are_refused() -> None:
    with pytest.raises(IaaError, match="NCCL cannot put two ranks of one run on a GPU"):
        resources.plan(GPU_NODES, 2, gpus_per_worker=0.5)
    assert resources.plan(GPU_NODES, 1, gpus_per_worker=0.5).trial_resources["gpu"] == 0.5
    assert resources.plan(GPU_NODES, 2, gpus_per_worker=1).worker_resources["GPU"] == 1


def test_gpu_workers_get_the_cpus_of_a_gpu_share_on_the_smallest_gpu_node() -> None:
    plan = resources.plan(GPU_NODES, 1, gpus_per_worker=1)
    assert plan.threads == 8 and plan.max_concurrent == 5      # 1 + 4 GPUs; the head has none
    assert resources.plan(GPU_NODES, 1, gpus_per_worker=0.5).threads == 4


def test_trial_drivers_ask_for_the_driver_resource_when_a_node_offers_it() -> None:
    plan = resources.plan(GPU_NODES, 2, gpus_per_worker=1)
    assert plan.trial_resources == {"cpu": DRIVER_CPU, DRIVER_RESOURCE: DRIVER_CPU}
    in_actor = resources.plan(GPU_NODES, 1, gpus_per_worker=1)
    assert DRIVER_RESOURCE not in in_actor.trial_resources      # it trains itself, on a GPU node
    bare = resources.plan((Node("g1", cpus=8, gpus=2),), 2, gpus_per_worker=1)
    assert DRIVER_RESOURCE not in bare.trial_resources          # no node has it: nothing would run


def test_a_growing_cluster_queues_trials_beyond_what_fits_today() -> None:
    nodes = (Node("head", cpus=8), Node("g1", cpus=8, gpus=1))
    with pytest.raises(IaaError, match="`max_concurrent` 4"):
        resources.plan(nodes, 1, gpus_per_worker=1, max_concurrent=4)
    assert resources.plan(nodes, 1, gpus_per_worker=1, max_concurrent=4, queue=True).max_concurrent == 4
    queued = resources.plan(nodes, 1, gpus_per_worker=1, num_trials=6, queue=True)
    assert (queued.max_concurrent, queued.fits_now) == (6, 1)          # 6 admitted, 1 runs on today's nodes
    assert resources.plan(nodes, 1, gpus_per_worker=1, num_trials=6).max_concurrent == 1


def test_a_local_cluster_without_gpus_is_refused_at_once() -> None:
    info = ClusterInfo((Node("laptop", cpus=2),), address=None)
    with pytest.raises(IaaError, match="asks for GPUs, but the cluster has none"):
        cluster.fit_trials(info, 1, gpus_per_worker=1, num_trials=2)


def test_train_device_follows_the_assigned_gpus_or_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(resources.TRAIN_DEVICE_ENV, raising=False)
    assert resources.train_device(0) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(IaaError, match="IAA_TRAIN_DEVICE=cpu"):
            resources.train_device(1)
    monkeypatch.setenv(resources.TRAIN_DEVICE_ENV, "cpu")
    assert resources.train_device(1) == torch.device("cpu")
    assert resources.job_env()[resources.TRAIN_DEVICE_ENV] == "cpu"
    monkeypatch.setenv(resources.TRAIN_DEVICE_ENV, "tpu")
    with pytest.raises(IaaError, match="use cpu or cuda"):
        resources.train_device(1)


@pytest.mark.gpu
def test_a_worker_given_a_gpu_trains_on_its_first_visible_device(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False); run `pytest -m gpu` on a GPU machine")
    monkeypatch.delenv(resources.TRAIN_DEVICE_ENV, raising=False)
    assert resources.train_device(1) == torch.device("cuda", 0)


def test_gpu_workers_all_reduce_with_nccl_unless_forced_onto_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(resources.TRAIN_DEVICE_ENV, raising=False)
    assert process_group_backend(True) == "nccl" and process_group_backend(False) == "gloo"
    monkeypatch.setenv(resources.TRAIN_DEVICE_ENV, "cpu")
    assert process_group_backend(True) == "gloo"


def test_a_growing_cluster_refuses_impossible_requests_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_wait(*args, **kwargs):
        raise AssertionError("asked the autoscaler for a request no node can hold")

    monkeypatch.setattr(resources, "wait_for", no_wait)
    info = ClusterInfo((Node("head", cpus=8),), address="10.0.0.1:6379")
    with pytest.raises(IaaError, match="NCCL"):
        cluster.fit_trials(info, 2, gpus_per_worker=0.5)
    with pytest.raises(IaaError, match="whole number"):
        cluster.fit_trials(info, 1, gpus_per_worker=1.5)
