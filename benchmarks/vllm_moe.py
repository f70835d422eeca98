"""Does the vLLM CPU build serve the mixture-of-experts architectures of issue 30? (section ``vllm-moe``)

For each configuration a tiny seeded model of the ``transformers`` class (Qwen3-MoE: 8 experts, 2
per token; Mixtral: 4 experts, 2 per token; 2 layers, hidden 128, 4 heads of 32, float32) is saved
with ``save_pretrained`` and started in ``vllm.LLM`` (eager, ``skip_tokenizer_init``), in a
process of its own; 8 tokens are sampled from a 5-token prompt and their log-probs compared with a
float32 ``transformers`` forward pass of the same weights. Configurations: Qwen3-MoE at TP 1, at
TP 2 (experts split over the TP ranks) and at TP 2 with ``enable_expert_parallel`` (EP 2);
Mixtral at TP 1. A failure is reported with the engine's last error line. Then a weight update of
the Qwen3-MoE model on rpeg's ``RolloutEngine``: the log-prob gap after vLLM's own in-place reload
and after rpeg's push, which repacks the experts.

Run from the repository root::

    python benchmarks/vllm_moe.py [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _bench import command, machine, write_section

#: ``(label, architecture, tensor-parallel size, expert parallelism)``
CONFIGS = [
    ("Qwen3-MoE, TP 1", "qwen3_moe", 1, False),
    ("Qwen3-MoE, TP 2", "qwen3_moe", 2, False),
    ("Qwen3-MoE, TP 2 + enable_expert_parallel (EP 2)", "qwen3_moe", 2, True),
    ("Mixtral, TP 1", "mixtral", 1, False),
]


def _model(kind: str, path: str):
    """A seeded tiny model of ``kind``, saved to ``path``."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = {"vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    common |= {"num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": False}
    if kind == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(
            **common,
            head_dim=32,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
        model = tf.Qwen3MoeForCausalLM(cfg)
    else:
        cfg = tf.MixtralConfig(**common, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)
        model = tf.MixtralForCausalLM(cfg)
    model.save_pretrained(path, safe_serialization=True)
    return model.eval()


def probe(kind: str, tp: int, ep: bool) -> dict:
    """Start the engine on a fresh model; tokens, the largest log-prob gap and the start time."""
    import torch
    import vllm

    with tempfile.TemporaryDirectory() as path:
        model = _model(kind, path)
        t0 = time.perf_counter()
        llm = vllm.LLM(
            model=path,
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=128,
            seed=0,
            enforce_eager=True,
            distributed_executor_backend="mp",
            tensor_parallel_size=tp,
            enable_expert_parallel=ep,
        )
        start = time.perf_counter() - t0
        prompt = [1, 5, 9, 17, 33]
        params = vllm.SamplingParams(max_tokens=8, seed=3, logprobs=0, detokenize=False)
        out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
        tokens = list(out.token_ids)
        got = [next(iter(d.values())).logprob for d in out.logprobs]
        with torch.no_grad():
            logp = model(torch.tensor([prompt + tokens])).logits.float().log_softmax(-1)[0]
        want = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]
        return {"start_s": start, "gap": max(abs(a - b) for a, b in zip(got, want)), "tokens": len(tokens)}


def update_probe() -> dict:
    """A weight update of a tiny Qwen3-MoE on rpeg's ``RolloutEngine`` (TP 1): the log-prob gap to
    ``transformers`` before, after vLLM's own in-place reload of new expert weights, and after
    rpeg's push of the same weights (reload, then the experts' repacking,
    ``vllm_engine._prepack_cpu_experts``)."""
    import torch

    from rpeg.runtime.engines import vllm_engine as ve
    from rpeg.runtime.engines.hf_models import checkpoint_state

    def gap(engine, model) -> float:
        prompts = [[1, 5, 9, 17, 33], [2, 4, 8, 16, 32]]
        out = engine.generate(prompts, max_tokens=[8, 8], seeds=[3, 4])
        return ve.logprob_gap(out, model, prompts)

    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as new_dir:
        model = _model("qwen3_moe", path)
        engine = ve.RolloutEngine(path, max_model_len=128)
        try:
            before = gap(engine, model)
            g = torch.Generator().manual_seed(1)
            state = {
                k: v + 0.05 * torch.randn(v.shape, generator=g) if ".experts." in k else v
                for k, v in model.state_dict().items()
            }
            model.load_state_dict(state)
            model.save_pretrained(new_dir, safe_serialization=True)
            engine._llm.collective_rpc(  # vLLM's own reload, as RL frameworks call it
                "reload_weights", kwargs={"weights_path": new_dir, "is_checkpoint_format": True}
            )
            plain = gap(engine, model)
            moe = type("Spec", (), {"is_moe": True})()  # checkpoint_state only asks this
            sent = checkpoint_state(state, moe)
            pushed = engine.update_weights(sent)
            fixed = gap(engine, model)
        finally:
            engine.shutdown()
    match = pushed["rank_checksums"] == [ve.state_checksum(sent)] * len(pushed["rank_checksums"])
    return {"before": before, "vllm_reload": plain, "rpeg_push": fixed, "match": match}


def _child(args: list[str], tp: int) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run this script with ``args`` in a process of its own (one engine each); its result line."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
    proc = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc, (json.loads(found[-1][7:]) if found else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "TP", "EP"), help=argparse.SUPPRESS)
    ap.add_argument("--child-update", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_update:
        print("RESULT " + json.dumps(update_probe()), flush=True)
        return 0
    if args.child:
        kind, tp, ep = args.child
        print("RESULT " + json.dumps(probe(kind, int(tp), ep == "1")), flush=True)
        return 0
    rows = [
        "| configuration | serves | engine start s | tokens | max log-prob gap | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for label, kind, tp, ep in CONFIGS:
        proc, r = _child(["--child", kind, str(tp), "1" if ep else "0"], tp)
        if r is not None:
            rows.append(f"| {label} | yes | {r['start_s']:.1f} | {r['tokens']} | {r['gap']:.1e} | |")
        else:
            lines = (proc.stdout + proc.stderr).splitlines()
            died = [ln for ln in lines if "died unexpectedly" in ln]  # a worker's crash, else the error
            why = (died or [ln for ln in lines if "Error:" in ln] or ["no result"])[-1]
            rows.append(f"| {label} | **no** | – | – | – | {why.split(']')[-1].strip()[:160]} |")
        print(rows[-1], flush=True)
    proc, u = _child(["--child-update"], 1)
    if u is not None:
        update = [
            "| Qwen3-MoE, TP 1 | before any update | after vLLM's `reload_weights` | after rpeg's push "
            "(reload + expert repack) | checksums |",
            "|---|---:|---:|---:|---|",
            f"| max log-prob gap | {u['before']:.1e} | {u['vllm_reload']:.1e} | {u['rpeg_push']:.1e} | "
            f"{'match' if u['match'] else 'differ'} |",
        ]
    else:
        update = [f"The update probe gave no result: {(proc.stdout + proc.stderr).strip().splitlines()[-1:]}"]
    print("\n".join(update), flush=True)
    out = [
        "## The vLLM CPU build on mixture-of-experts models (issue 30)",
        "",
        f"Command: `{command('vllm_moe.py', argv)}`. Machine: {machine()}.",
        "",
        "Tiny seeded models of the `transformers` classes (2 layers, hidden 128, 4 heads of 32, float32; "
        "Qwen3-MoE 8 experts, Mixtral 4, 2 per token), 8 sampled tokens, their log-probs against a float32 "
        "`transformers` forward pass of the same weights.",
        "",
        *rows,
        "",
        "A weight update (the experts of the same Qwen3-MoE perturbed by N(0, 0.05²)) on rpeg's "
        "`RolloutEngine`: vLLM 0.32's in-place reload copies the new experts into the parameters but "
        "does not repack them into the CPU grouped-GEMM layout; rpeg's weight push repacks them "
        "(`vllm_engine._prepack_cpu_experts`).",
        "",
        *update,
    ]
    if not args.no_write:
        write_section("vllm-moe", out)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
