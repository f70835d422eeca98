"""What a pipeline, a plan and an executable graph are: models, workloads, the cluster's
device space, the RPEG and its templates, plans, unrolling and lowering (SPEC §2–§5)."""

from .cluster import TIER_CLUSTER, TIER_NODE, TIER_RACK, Allocation, Cluster
from .graph import RPEG, Container, DataEdge, ModelInstance, PubEdge, Vertex
from .hardware import Hardware, Link
from .lower import ExecGraph, lower
from .models import MODEL_PRESETS, ModelSpec, model_preset
from .plan import Choice, Plan, Strategy, check_strategy
from .templates import Structure, build_graph, structures
from .types import Head, NodeKind, Recompute, Role
from .unroll import EdgeKind, UEdge, Unrolled, unroll
from .workload import ALGORITHMS, Workload, WorkloadFile, load_workload

__all__ = [
    "ALGORITHMS",
    "MODEL_PRESETS",
    "RPEG",
    "TIER_CLUSTER",
    "TIER_NODE",
    "TIER_RACK",
    "Allocation",
    "Choice",
    "Cluster",
    "Container",
    "DataEdge",
    "EdgeKind",
    "ExecGraph",
    "Hardware",
    "Head",
    "Link",
    "ModelInstance",
    "ModelSpec",
    "NodeKind",
    "Plan",
    "PubEdge",
    "Recompute",
    "Role",
    "Strategy",
    "Structure",
    "UEdge",
    "Unrolled",
    "Vertex",
    "Workload",
    "WorkloadFile",
    "build_graph",
    "check_strategy",
    "load_workload",
    "lower",
    "model_preset",
    "structures",
    "unroll",
]
