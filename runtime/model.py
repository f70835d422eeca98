"""A small decoder-only transformer built from a :class:`~rpeg.ir.models.ModelSpec` (SPEC §11).

The runtime executes plans with real PyTorch models, scaled down so that they run on CPUs and in
tests. Three properties make every parallel layout compute the same model:

* **Weights are a function of (seed, parameter name) only.** Every parameter is drawn from its own
  ``torch.Generator`` seeded by a stable hash of ``f"{seed}/{name}"``, and block parameters are named
  by their *global* layer index (``layers.5.attn.q_proj.weight`` on whichever pipeline stage holds
  layer 5). Any split of the layers into stages and any tensor-parallel sharding therefore rebuilds
  exactly the same full model, and stage state dicts merge by key union.
* **Attention reshapes with ``-1`` heads.** ``q.view(b, s, -1, head_dim)`` works on the local heads
  when the projections are sharded column-wise (:meth:`Transformer.tp_plan`), so one code path
  serves TP = 1 and TP > 1.
* **Sampling noise is keyed by sequence, not by batch slot.** :func:`sample_token` draws the Gumbel
  noise of sequence ``i`` at response position ``t`` from a generator seeded by
  ``(seed, sample_ids[i], t)``, so a sequence gets the same tokens whichever rank or batch split
  generates it.

The model always computes in float32 (``spec.dtype_bytes`` describes the production model the plan
was made for, not this stand-in).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.nn import functional as F  # noqa: N812

from ..ir.models import ModelSpec
from ..ir.types import Head

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = [
    "SCALES",
    "KVCache",
    "Transformer",
    "generate",
    "sample_token",
    "scale_spec",
    "stable_seed",
    "stage_layer_ranges",
    "token_logprobs",
]

#: Named scales of :func:`scale_spec`: layers, query heads and head width before TP adjustment.
SCALES: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "heads": 4, "head_dim": 16},
    "small": {"layers": 4, "heads": 8, "head_dim": 16},
}

_INIT_STD = 0.02  # normal(0, 0.02) for matrices and embeddings (GPT-2 / Llama convention)
_VALUE_STD = 0.002  # value head starts small so early critic values sit near zero
_ROPE_BASE = 10000.0


def stable_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on ``parts`` (never on ``PYTHONHASHSEED`` or the process).

    ``seed = int(blake2b("/".join(map(str, parts)))[:8]) mod 2^63``.
    """
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------------------------------------- specs
def scale_spec(
    spec: ModelSpec,
    scale: str | dict[str, int] = "tiny",
    *,
    vocab: int,
    min_layers: int = 1,
    tp: int = 1,
) -> ModelSpec:
    """A scaled-down copy of ``spec`` that runs on CPUs and splits evenly over ``tp`` ranks.

    Named scales (:data:`SCALES`): ``"tiny"`` has ``max(2, min_layers)`` layers and 4 heads,
    ``"small"`` ``max(4, min_layers)`` layers and 8 heads. The head count is raised to the smallest
    multiple of ``tp`` not below that (``max(4, tp)`` for ``tp`` a power of two), heads are 16 wide,
    ``hidden = heads·16`` (64 for tiny, 128 for small), ``kv_heads = heads`` and
    ``ffn_hidden = 2·hidden``. ``ffn_projections`` and ``tied_embeddings`` are those of ``spec``,
    ``vocab`` is the task's.

    A dict starts from ``"tiny"`` and overrides the given :class:`ModelSpec` fields; fields derived
    from an overridden one follow it unless given too (``head_dim = hidden/heads``,
    ``kv_heads = heads``, ``ffn_hidden = 2·hidden``).

    Raises
    ------
    ValueError
        For an unknown scale name (listing the known ones), an unknown dict field, or a layout that
        ``tp`` cannot shard: ``heads``, ``kv_heads`` or ``ffn_hidden`` not divisible by ``tp``, or an
        odd ``head_dim`` (RoPE rotates pairs). Messages name the field and the value.
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"scale_spec: tp must be a positive integer, got {tp!r}")
    base = "tiny" if isinstance(scale, dict) else scale
    if base not in SCALES:
        raise ValueError(f"scale_spec: unknown scale={scale!r}; known scales: {', '.join(SCALES)}")
    named = SCALES[base]
    heads = tp * math.ceil(named["heads"] / tp)
    hidden = heads * named["head_dim"]
    fields: dict[str, object] = {
        "name": f"{spec.name}-{base}",
        "layers": max(named["layers"], min_layers),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": heads,
        "head_dim": named["head_dim"],
        "ffn_hidden": 2 * hidden,
        "vocab": vocab,
    }
    if isinstance(scale, dict):
        known = set(ModelSpec.__dataclass_fields__)
        for key in scale:
            if key not in known:
                raise ValueError(
                    f"scale_spec: unknown field {key!r} in scale={scale!r}; fields: {', '.join(sorted(known))}"
                )
        if ("hidden" in scale or "heads" in scale) and "head_dim" not in scale:
            fields["head_dim"] = 0  # ModelSpec derives hidden // heads
        if "heads" in scale and "kv_heads" not in scale:
            fields["kv_heads"] = scale["heads"]
        if "hidden" in scale and "ffn_hidden" not in scale:
            fields["ffn_hidden"] = 2 * scale["hidden"]
        fields.update(scale)
        fields["name"] = f"{spec.name}-custom"
    out = replace(spec, **fields)
    for field in ("heads", "kv_heads", "ffn_hidden"):
        value = getattr(out, field)
        if value % tp:
            raise ValueError(f"scale_spec: {field}={value} is not divisible by tp={tp}")
    if out.head_dim % 2:
        raise ValueError(f"scale_spec: head_dim={out.head_dim} must be even for rotary embeddings")
    return out


def stage_layer_ranges(layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` layer ranges of ``stages`` pipeline stages, as even as possible.

    The first ``layers mod stages`` stages hold one extra layer.

    Raises
    ------
    ValueError
        If ``stages`` is not in ``1..layers``.
    """
    if not 1 <= stages <= layers:
        raise ValueError(f"stage_layer_ranges: stages={stages} must be between 1 and layers={layers}")
    size, extra = divmod(layers, stages)
    out, start = [], 0
    for p in range(stages):
        stop = start + size + (p < extra)
        out.append((start, stop))
        start = stop
    return out


# ---------------------------------------------------------------------------------------------- cache
class KVCache:
    """Keys and values of the layers of one model (or one pipeline stage) for incremental decoding.

    ``keys[i]`` and ``values[i]`` are ``[b, kv_heads_local, t, head_dim]`` for global layer ``i``.
    A forward pass reads :attr:`length` (positions already cached) to place its tokens, every layer
    calls :meth:`append`, and the model calls :meth:`advance` once at the end of the pass.
    """

    def __init__(self) -> None:
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        self.length = 0

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Concatenate new ``k, v`` (``[b, h, s, hd]``) to layer ``layer``'s cache; return the whole."""
        if layer in self.keys:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def advance(self, steps: int) -> None:
        """Mark ``steps`` more positions as cached (called once per forward pass)."""
        self.length += steps

    def select(self, index: Tensor) -> None:
        """Keep only the sequences ``index`` (batch dimension) in every layer's cache."""
        for layer in self.keys:
            self.keys[layer] = self.keys[layer].index_select(0, index)
            self.values[layer] = self.values[layer].index_select(0, index)


# ---------------------------------------------------------------------------------------------- blocks
def _rotate(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding (Su et al., 2021) on ``x = [b, s, h, hd]``.

    For pair ``j`` of a head, ``θ_j = base^(−2j/hd)`` and the pair ``(x_j, x_{j+hd/2})`` is rotated by
    the angle ``p·θ_j`` at position ``p`` (the half-split layout of GPT-NeoX / Llama).
    ``positions`` is ``[s]`` or ``[b, s]``.
    """
    hd = x.shape[-1]
    inv = _ROPE_BASE ** (-torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
    angles = positions.to(torch.float32)[..., None] * inv  # [.., s, hd/2]
    if angles.dim() == 2:
        angles = angles[None]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, :, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, :, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Causal multi-head attention with grouped-query K/V and RoPE.

    ``out = o_proj(softmax(q kᵀ/√hd + causal) v)``; the number of heads is read from the projection
    outputs (``view(b, s, -1, hd)``), so column-sharded projections compute on their local heads.
    """

    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.head_dim = spec.head_dim
        self.group = spec.heads // spec.kv_heads  # query heads per K/V head, the same on every shard
        self.q_proj = nn.Linear(spec.hidden, spec.q_width, bias=False)
        self.k_proj = nn.Linear(spec.hidden, spec.kv_width, bias=False)
        self.v_proj = nn.Linear(spec.hidden, spec.kv_width, bias=False)
        self.o_proj = nn.Linear(spec.q_width, spec.hidden, bias=False)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache | None, past: int) -> Tensor:
        b, s, _ = x.shape
        q = _rotate(self.q_proj(x).view(b, s, -1, self.head_dim), positions).transpose(1, 2)
        k = _rotate(self.k_proj(x).view(b, s, -1, self.head_dim), positions).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(self.layer, k, v)
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
        if past == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1)
        else:
            # Query i sits at position past + i and sees keys 0..past + i.
            t = k.shape[2]
            mask = (
                torch.arange(t, device=x.device)[None, :] <= past + torch.arange(s, device=x.device)[:, None]
            )
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """Feed-forward block: ``down(silu(gate(x)) ⊙ up(x))`` with 3 projections, ``down(gelu(up(x)))``
    with 2."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gated = spec.ffn_projections == 3
        if self.gated:
            self.gate_proj = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``h = x + attn(norm(x))``, ``out = h + mlp(norm(h))``."""

    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.attn = Attention(spec, layer)
        self.mlp_norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.mlp = MLP(spec)

    def forward(self, x: Tensor, positions: Tensor, cache: KVCache | None, past: int) -> Tensor:
        x = x + self.attn(self.attn_norm(x), positions, cache, past)
        return x + self.mlp(self.mlp_norm(x))


# ---------------------------------------------------------------------------------------------- model
class Transformer(nn.Module):
    """Decoder-only transformer (or one pipeline stage of it) with seeded weights.

    Parameters
    ----------
    spec
        Model shape (usually from :func:`scale_spec`).
    head
        Output head(s) on the last stage: ``LM`` (``lm_head``, ``d → V``, no bias), ``SCALAR``
        (``value_head``, ``d → 1``) or ``BOTH``.
    seed
        Weight seed: parameter ``name`` is drawn from a generator seeded by
        ``stable_seed(seed, name)``; matrices and embeddings ``~ N(0, 0.02²)``, the value head
        ``~ N(0, 0.002²)`` with zero bias, norm weights 1. With ``spec.tied_embeddings`` the LM head
        is drawn with the embedding's key, so it *starts* equal to the embedding; the two are separate
        parameters afterwards (a tie across pipeline stages would couple their updates).
    layer_range
        Global ``[start, stop)`` of the blocks held here; all layers by default. Blocks live in
        ``self.layers``, an ``nn.ModuleDict`` keyed by ``str(global index)``.
    first, last
        Whether this stage holds the embedding (input tokens) and the final norm with the heads.

    Raises
    ------
    ValueError
        If ``layer_range`` is not inside ``0..spec.layers`` or ``spec.head_dim`` is odd.
    """

    def __init__(
        self,
        spec: ModelSpec,
        head: Head,
        *,
        seed: int,
        layer_range: tuple[int, int] | None = None,
        first: bool = True,
        last: bool = True,
    ) -> None:
        super().__init__()
        start, stop = layer_range if layer_range is not None else (0, spec.layers)
        if not 0 <= start <= stop <= spec.layers:
            raise ValueError(
                f"Transformer: layer_range={layer_range!r} must satisfy 0 <= start <= stop <= {spec.layers}"
            )
        if spec.head_dim % 2:
            raise ValueError(f"Transformer: head_dim={spec.head_dim} must be even for rotary embeddings")
        self.spec, self.head, self.seed = spec, Head(head), seed
        self.layer_range, self.first, self.last = (start, stop), first, last
        if first:
            self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(start, stop)})
        if last:
            self.norm = nn.RMSNorm(spec.hidden, eps=1e-5)
            if self.head in (Head.LM, Head.BOTH):
                self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
            if self.head in (Head.SCALAR, Head.BOTH):
                self.value_head = nn.Linear(spec.hidden, 1)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        for name, param in self.named_parameters():
            key = "embed.weight" if name == "lm_head.weight" and self.spec.tied_embeddings else name
            gen = torch.Generator().manual_seed(stable_seed(self.seed, key))
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name == "value_head.bias":
                param.zero_()
            else:
                std = _VALUE_STD if name.startswith("value_head") else _INIT_STD
                param.copy_(torch.randn(param.shape, generator=gen) * std)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        """Megatron-style tensor-parallel plan for ``parallelize_module(model, mesh, plan)``.

        Per block: ``q_proj, k_proj, v_proj, gate_proj, up_proj`` column-wise (each rank holds whole
        heads / a slice of the FFN width), ``o_proj, down_proj`` row-wise (their outputs are
        all-reduced back to replicated hidden states); module outputs are local tensors. The
        embedding, the norms and the heads stay replicated.
        """
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan: dict[str, ParallelStyle] = {}
        for i, block in self.layers.items():
            for proj in ("q_proj", "k_proj", "v_proj"):
                plan[f"layers.{i}.attn.{proj}"] = ColwiseParallel()
            plan[f"layers.{i}.attn.o_proj"] = RowwiseParallel()
            if block.mlp.gated:
                plan[f"layers.{i}.mlp.gate_proj"] = ColwiseParallel()
            plan[f"layers.{i}.mlp.up_proj"] = ColwiseParallel()
            plan[f"layers.{i}.mlp.down_proj"] = RowwiseParallel()
        return plan

    def forward_hidden(
        self, x: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """Embedding (first stage) and this stage's blocks: returns hidden ``[b, s, d]`` (before the
        final norm).

        ``x`` is int64 tokens ``[b, s]`` on the first stage, hidden ``[b, s, d]`` otherwise.
        ``positions`` (``[s]`` or ``[b, s]``) default to ``past, …, past + s − 1`` with
        ``past = cache.length`` (0 without a cache). With a cache the pass appends its keys/values and
        advances the cache by ``s``.
        """
        h = self.embed(x) if self.first else x
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + h.shape[1], device=h.device)
        for block in self.layers.values():
            h = block(h, positions, cache, past)
        if cache is not None:
            cache.advance(h.shape[1])
        return h

    def heads(self, hidden: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Final norm and output heads (last stage only).

        Returns logits ``[b, s, V]`` for ``LM``, values ``[b, s]`` for ``SCALAR`` and the tuple
        ``(logits, values)`` for ``BOTH``.
        """
        if not self.last:
            raise ValueError("Transformer.heads: this stage has last=False and holds no heads")
        h = self.norm(hidden)
        if self.head is Head.LM:
            return self.lm_head(h)
        values = self.value_head(h).squeeze(-1)
        if self.head is Head.SCALAR:
            return values
        return self.lm_head(h), values

    def forward(
        self, x: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``heads(forward_hidden(x))`` on the last stage, ``forward_hidden(x)`` on the others."""
        h = self.forward_hidden(x, positions=positions, cache=cache)
        return self.heads(h) if self.last else h


# ---------------------------------------------------------------------------------------------- sampling
def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probabilities of ``tokens`` under ``softmax(logits)``: ``log_softmax(logits)[…, tokens]``.

    ``logits`` is ``[b, s, V]`` (or ``[b, V]``), ``tokens`` ``[b, s]`` (or ``[b]``); the result has the
    shape of ``tokens`` and is computed in float32.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _gumbel(seed: int, sample_ids: Tensor, t: int, vocab: int) -> Tensor:
    """Gumbel noise ``g = −log(−log u)``, ``u ~ U(0, 1)``, row ``i`` seeded by ``(seed, sample_ids[i], t)``."""
    rows = []
    for sid in sample_ids.tolist():
        gen = torch.Generator().manual_seed(stable_seed(seed, sid, t))
        rows.append(torch.rand(vocab, generator=gen, dtype=torch.float64))
    u = torch.stack(rows).clamp_(1e-12, 1.0 - 1e-12)
    return -torch.log(-torch.log(u))


def sample_token(
    logits: Tensor, seed: int, sample_ids: Tensor, t: int, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Sample one token per sequence with layout-independent noise (Gumbel-max trick).

    ``token_i = argmax(logits_i/T + g_i)`` with ``g_i`` from :func:`_gumbel` keyed by
    ``(seed, sample_ids[i], t)``, which is a draw from ``softmax(logits_i/T)``. ``T = 0`` is greedy
    decoding (``argmax logits_i``) and then the log-probability is taken under ``softmax(logits_i)``.

    Parameters
    ----------
    logits
        ``[b, V]`` logits of the next token.
    seed, sample_ids, t
        Noise key: the run's seed, one global id per sequence (``[b]`` int64) and the response
        position ``t`` (0 for the first generated token).
    temperature
        ``T ≥ 0``.

    Returns
    -------
    tokens, logp
        ``[b]`` int64 tokens and their float32 log-probabilities under ``softmax(logits/T)``.

    Raises
    ------
    ValueError
        If ``temperature`` is negative.
    """
    if temperature < 0:
        raise ValueError(f"sample_token: temperature must be >= 0, got {temperature!r}")
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    if temperature == 0:
        tokens = scaled.argmax(-1)
    else:
        noise = _gumbel(seed, sample_ids, t, logits.shape[-1]).to(scaled.device)
        tokens = (scaled.double() + noise).argmax(-1)
    return tokens, token_logprobs(scaled, tokens)


@torch.no_grad()
def generate(
    model: Transformer,
    prompts: Tensor,
    max_new: int,
    *,
    seed: int,
    sample_ids: Tensor,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Autoregressive rollout with a KV cache: prefill over the prompt, then ``max_new − 1`` decode
    steps of one token (a single-stage model with ``first`` and ``last``).

    Every sequence has the same prompt length and runs for exactly ``max_new`` tokens (no early stop).
    Token ``t`` of sequence ``i`` comes from :func:`sample_token` keyed by ``(seed, sample_ids[i], t)``,
    so the result does not depend on how the batch is split.

    Returns
    -------
    tokens, logp
        ``[b, Lp + max_new]`` prompts followed by the completions, and ``[b, max_new]`` log-probs of
        the generated tokens under ``softmax(logits/T)``.

    Raises
    ------
    ValueError
        For a pipeline stage (``first`` or ``last`` false), a model without an LM head, or
        ``max_new < 1``.
    """
    if not (model.first and model.last) or model.head is Head.SCALAR:
        raise ValueError("generate: needs a single-stage model with an LM head (first=last=True)")
    if max_new < 1:
        raise ValueError(f"generate: max_new must be >= 1, got {max_new!r}")
    cache = KVCache()
    out = model(prompts, cache=cache)
    logits = out[0] if isinstance(out, tuple) else out
    tokens, logps = [], []
    for t in range(max_new):
        tok, lp = sample_token(logits[:, -1], seed, sample_ids, t, temperature)
        tokens.append(tok)
        logps.append(lp)
        if t + 1 < max_new:
            out = model(tok[:, None], cache=cache)
            logits = out[0] if isinstance(out, tuple) else out
    return torch.cat([prompts, torch.stack(tokens, dim=1)], dim=1), torch.stack(logps, dim=1)
