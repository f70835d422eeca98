"""The runtime's model: a Hugging Face decoder model, or one pipeline stage of it (SPEC §11).

Plans are made for full-size models; the runtime runs models of the same architecture scaled by
:func:`scale_spec` (``--scale``), built from ``transformers``' own decoder layers
(:class:`StageModel`; Llama, Qwen2 and Mistral, :mod:`~rpeg.runtime.engines.hf_models`), or a
checkpoint the user names. Three properties make every parallel layout compute the same model:

* **Weights are a function of (seed, parameter name) only.** Every parameter is drawn from its own
  ``torch.Generator`` seeded by a stable hash of ``f"{seed}/{name}"``, and decoder layers are named
  by their *global* index (``model.layers.5.self_attn.q_proj.weight`` on whichever pipeline stage
  holds layer 5). Any split of the layers into stages and any tensor-parallel sharding therefore
  rebuilds exactly the same full model, and stage state dicts merge by key union into a Hugging
  Face checkpoint.
* **Attention reshapes with ``-1`` heads.** ``transformers``' attention views its projections as
  ``(b, s, -1, head_dim)``, which works on the local heads when the projections are sharded
  column-wise (:meth:`StageModel.tp_plan`), so one code path serves TP = 1 and TP > 1.
* **Sampling noise is keyed by sequence, not by batch slot.** :func:`sample_token` draws the Gumbel
  noise of sequence ``i`` at response position ``t`` from a generator seeded by
  ``(seed, sample_ids[i], t)``, so a sequence gets the same tokens whichever rank or batch split
  generates it (the torch engine's generation; vLLM rollouts use per-request seeds instead).

The model always computes in float32 (``spec.dtype_bytes`` describes the production model the plan
was made for, not this stand-in).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint as layer_checkpoint

from ...ir.errors import check_positive_int
from ...ir.models import ModelSpec
from ...ir.types import Head

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from .context import ContextParallel
    from .experts import ExpertGroup

__all__ = [
    "KVCache",
    "StageModel",
    "generate",
    "in_token_chunks",
    "sample_token",
    "stable_seed",
    "token_logprobs",
]

_INIT_STD = 0.02  # normal(0, 0.02) for matrices and embeddings (GPT-2 / Llama convention)
_VALUE_STD = 0.002  # value head starts small so early critic values sit near zero


def stable_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on ``parts`` (never on ``PYTHONHASHSEED`` or the process).

    ``seed = int(blake2b("/".join(map(str, parts)))[:8]) mod 2^63``.
    """
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------------------------------------- specs
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

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, *_: object, **__: object
    ) -> tuple[Tensor, Tensor]:
        """The ``transformers`` cache protocol (``Cache.update``): :meth:`append` for ``layer_idx``."""
        return self.append(layer_idx, key_states, value_states)

    def advance(self, steps: int) -> None:
        """Mark ``steps`` more positions as cached (called once per forward pass)."""
        self.length += steps

    def select(self, index: Tensor) -> None:
        """Keep only the sequences ``index`` (batch dimension) in every layer's cache."""
        for layer in self.keys:
            self.keys[layer] = self.keys[layer].index_select(0, index)
            self.values[layer] = self.values[layer].index_select(0, index)


# ---------------------------------------------------------------------------------------------- model
class _Backbone(nn.Module):
    """The ``model.`` part of a Hugging Face causal LM: embedding, decoder layers, final norm."""


class StageModel(nn.Module):
    """A Hugging Face decoder model (or one pipeline stage of it) with seeded weights.

    The blocks are the ``transformers`` classes of the spec's family (``LlamaDecoderLayer``,
    ``Qwen2DecoderLayer``, ``MistralDecoderLayer`` with their RMSNorm and rotary embedding; see
    :func:`~rpeg.runtime.engines.hf_models.hf_config`), and parameters carry the names of the
    family's ``…ForCausalLM``: ``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``,
    …, ``model.norm.weight``, ``lm_head.weight``, so a full model's state dict *is* a Hugging Face
    checkpoint (:func:`~rpeg.runtime.engines.hf_models.save_checkpoint`) that ``transformers`` and
    vLLM load. Critic and reward models are the same backbone with a scalar head ``value_head``
    (``d → 1`` with bias) in place of (``SCALAR``) or beside (``BOTH``) the LM head.

    Parameters
    ----------
    spec
        Model shape (usually from :func:`scale_spec`); ``spec.family`` picks the architecture.
    head
        Output head(s) on the last stage: ``LM`` (``lm_head``, ``d → V``, no bias), ``SCALAR``
        (``value_head``, ``d → 1``) or ``BOTH``.
    seed
        Weight seed: parameter ``name`` is drawn from a generator seeded by
        ``stable_seed(seed, name)``; matrices, biases and embeddings ``~ N(0, 0.02²)`` (the
        ``initializer_range`` of the Hugging Face configs), the value head ``~ N(0, 0.002²)`` with
        zero bias, norm weights 1. With ``spec.tied_embeddings`` the LM head is drawn with the
        embedding's key, so it *starts* equal to the embedding; the two are separate parameters
        afterwards (a tie across pipeline stages would couple their updates).
    layer_range
        Global ``[start, stop)`` of the decoder layers held here; all layers by default. Layers live
        in ``self.model.layers``, an ``nn.ModuleDict`` keyed by ``str(global index)``, and each keeps
        its global ``layer_idx`` (the key of its KV cache).
    first, last
        Whether this stage holds the embedding (input tokens) and the final norm with the heads.
    recompute
        Activation recomputation of the training passes, as the runtime runs it (``"none"`` or
        ``"full"``; a plan's ``"selective"`` runs as ``"none"``,
        :data:`~rpeg.runtime.binding.RUNTIME_RECOMPUTE`): ``full`` checkpoints every decoder layer
        (``torch.utils.checkpoint``, non-reentrant) on passes that record gradients without a KV
        cache, ``none`` runs the layers as they are. Passes under ``torch.no_grad`` (inference,
        generation) are never checkpointed.

    Raises
    ------
    ValueError
        If ``layer_range`` is not inside ``0..spec.layers``, ``spec.head_dim`` is odd or
        ``recompute`` is not a mode.
    EngineMissing
        If ``transformers`` is not installed (extra ``hf``).
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
        recompute: str = "none",
        context: ContextParallel | None = None,
        experts: ExpertGroup | None = None,
    ) -> None:
        from ..engines.hf_models import family_modules, hf_config, runtime_family

        super().__init__()
        if recompute not in ("none", "full"):
            raise ValueError(f"StageModel: recompute={recompute!r} must be 'none' or 'full'")
        self.recompute = recompute
        start, stop = layer_range if layer_range is not None else (0, spec.layers)
        if not 0 <= start <= stop <= spec.layers:
            raise ValueError(
                f"StageModel: layer_range={layer_range!r} must satisfy 0 <= start <= stop <= {spec.layers}"
            )
        if spec.head_dim % 2:
            raise ValueError(f"StageModel: head_dim={spec.head_dim} must be even for rotary embeddings")
        self.spec, self.head, self.seed = spec, Head(head), seed
        self.layer_range, self.first, self.last = (start, stop), first, last
        self.config = hf_config(spec)
        self.context = context
        if context is not None and context.size > 1:  # the layers' attention exchanges over the CP group
            from .context import ATTENTION, register

            register()
            self.config._attn_implementation = ATTENTION  # attach() below gives each layer the group
        hf = family_modules(runtime_family(spec))
        self.model = _Backbone()
        if first:
            self.model.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.model.layers = nn.ModuleDict(
            {str(i): hf.DecoderLayer(self.config, i) for i in range(start, stop)}
        )
        if experts is not None and experts.size > 1:  # each rank holds E/Pe experts of each MoE layer
            from .experts import ParallelExperts

            for layer in self.model.layers.values():
                if hasattr(layer.mlp, "experts"):
                    layer.mlp.experts = ParallelExperts(layer.mlp.experts, experts)
        self.model.rotary_emb = hf.RotaryEmbedding(self.config)
        if last:
            self.model.norm = hf.RMSNorm(spec.hidden, eps=self.config.rms_norm_eps)
            if self.head in (Head.LM, Head.BOTH):
                self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
            if self.head in (Head.SCALAR, Head.BOTH):
                self.value_head = nn.Linear(spec.hidden, 1)
        self._init_weights()
        if self.context is not None and self.context.size > 1:
            self.context.attach(self)

    @torch.no_grad()
    def _init_weights(self) -> None:
        from .experts import expert_shard

        for name, param in self.named_parameters():
            tied = name == "lm_head.weight" and self.spec.tied_embeddings
            key = "model.embed_tokens.weight" if tied else name
            gen = torch.Generator().manual_seed(stable_seed(self.seed, key))
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                # stacked experts: expert e from its own key, whichever EP rank holds it
                shard = expert_shard(param)
                first = shard[1] * param.shape[0] if shard is not None else 0
                for j in range(param.shape[0]):
                    g = torch.Generator().manual_seed(stable_seed(self.seed, f"{name}.{first + j}"))
                    param[j].copy_(torch.randn(param.shape[1:], generator=g) * _INIT_STD)
            elif name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name == "value_head.bias":
                param.zero_()
            else:
                std = _VALUE_STD if name.startswith("value_head") else _INIT_STD
                param.copy_(torch.randn(param.shape, generator=gen) * std)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        """Megatron-style tensor-parallel plan for ``parallelize_module(model, mesh, plan)``.

        Per decoder layer: ``q_proj, k_proj, v_proj, gate_proj, up_proj`` column-wise (each rank
        holds whole heads / a slice of the FFN width; Qwen2's q/k/v biases are split with them),
        ``o_proj, down_proj`` row-wise (their outputs are all-reduced back to replicated hidden
        states); module outputs are local tensors. The Hugging Face attention reshapes with ``-1``
        heads, so it computes on the local heads unmodified. The embedding, the norms and the heads
        stay replicated.
        """
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan: dict[str, ParallelStyle] = {}
        for i in self.model.layers:
            for proj in ("q_proj", "k_proj", "v_proj"):
                plan[f"model.layers.{i}.self_attn.{proj}"] = ColwiseParallel()
            plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
            plan[f"model.layers.{i}.mlp.gate_proj"] = ColwiseParallel()
            plan[f"model.layers.{i}.mlp.up_proj"] = ColwiseParallel()
            plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
        return plan

    def forward_hidden(
        self, x: Tensor, *, positions: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """Embedding (first stage) and this stage's decoder layers: returns hidden ``[b, s, d]``
        (before the final norm).

        ``x`` is int64 tokens ``[b, s]`` on the first stage, hidden ``[b, s, d]`` otherwise.
        ``positions`` (``[s]`` or ``[b, s]``) default to ``past, …, past + s − 1`` with
        ``past = cache.length`` (0 without a cache). Attention is causal: without cached positions
        SDPA's causal kernel; with ``past > 0`` and ``s > 1`` an explicit mask (query ``i`` at
        position ``past + i`` sees keys ``0..past + i``); one new token sees all keys. With a cache
        the pass appends its keys/values and advances the cache by ``s``.
        """
        h = self.model.embed_tokens(x) if self.first else x
        past = cache.length if cache is not None else 0
        s = h.shape[1]
        if positions is None:
            positions = torch.arange(past, past + s, device=h.device)
        if positions.dim() == 1:
            positions = positions[None]
        mask = None
        if past > 0 and s > 1:
            keys = torch.arange(past + s, device=h.device)[None, :]
            mask = (keys <= past + torch.arange(s, device=h.device)[:, None])[None, None]
        rope = self.model.rotary_emb(h, positions)
        checkpointed = self.recompute == "full" and cache is None and torch.is_grad_enabled()
        for layer in self.model.layers.values():
            if checkpointed:  # keep the layer's input only; the backward recomputes its forward
                h = layer_checkpoint(
                    layer, h, attention_mask=mask, position_embeddings=rope, use_reentrant=False
                )
            else:
                h = layer(h, attention_mask=mask, position_embeddings=rope, past_key_values=cache)
        if cache is not None:
            cache.advance(s)
        return h

    def heads(self, hidden: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Final norm and output heads (last stage only).

        Returns logits ``[b, s, V]`` for ``LM``, values ``[b, s]`` for ``SCALAR`` and the tuple
        ``(logits, values)`` for ``BOTH``.
        """
        if not self.last:
            raise ValueError("StageModel.heads: this stage has last=False and holds no heads")
        h = self.model.norm(hidden)
        if self.head is Head.LM:
            return self.lm_head(h)
        values = self.value_head(h).squeeze(-1)
        if self.head is Head.SCALAR:
            return values
        return self.lm_head(h), values

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        heads: bool = True,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``heads(forward_hidden(x))`` on the last stage, ``forward_hidden(x)`` on the others
        and with ``heads=False`` (a caller that applies :meth:`heads` in chunks; through the
        module call, so FSDP2 gathers the root's parameters for it as for a whole pass).

        With a context-parallel group (``context``, ``Pc > 1``) a pass without a cache takes the
        whole sequences ``x`` (``[b, S]``), runs this rank's positions of them
        (:func:`~rpeg.runtime.worker.context.zigzag_positions`) and returns the full-length output
        with zeros at the other ranks' positions: summed over the CP group it is the unsplit
        model's output (:meth:`own_positions` names the rank's)."""
        if self.context is not None and self.context.size > 1:
            if cache is not None or positions is not None:
                raise ValueError(
                    "StageModel: a context-parallel model runs whole sequences without a cache or "
                    "positions (its generation runs on another layout)"
                )
            length = x.shape[1]
            pos = self.context.positions(length).to(x.device)
            h = self.forward_hidden(x[:, pos], positions=pos)
            return _scatter_positions(self.heads(h) if self.last and heads else h, pos, length)
        h = self.forward_hidden(x, positions=positions, cache=cache)
        return self.heads(h) if self.last and heads else h

    def own_positions(self, length: int) -> Tensor:
        """Whether each of ``length`` positions is computed on this rank (all of them without
        context parallelism), as a bool ``[length]``."""
        own = torch.ones(length, dtype=torch.bool)
        if self.context is not None and self.context.size > 1:
            own = torch.zeros(length, dtype=torch.bool)
            own[self.context.positions(length)] = True
        return own


def _scatter_positions(out: Tensor | tuple[Tensor, Tensor], pos: Tensor, length: int) -> Tensor | tuple:
    """Outputs at positions ``pos`` placed in zeros of ``length`` positions (dim 1; autograd-aware)."""
    if isinstance(out, tuple):
        return tuple(_scatter_positions(o, pos, length) for o in out)
    full = out.new_zeros((out.shape[0], length, *out.shape[2:]))
    return full.index_copy(1, pos.to(out.device), out)


# ---------------------------------------------------------------------------------------------- sampling
LOGPROB_CHUNK_LOGITS = 1 << 24
"""Logits (16 Mi, 64 MiB in float32) that :func:`token_logprobs` upcasts and normalises at a
time: the pass holds its logits in their own dtype plus this much, not a float32 copy and a
float32 log-softmax of all of them (2.5 × a bfloat16 model's logits measured on an H200 before;
benchmarks/RESULTS.md, "gpu-check")."""


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probabilities of ``tokens`` under ``softmax(logits/T)``: ``log_softmax(logits/T)[…, tokens]``.

    ``logits`` is ``[b, s, V]`` (or ``[b, V]``), ``tokens`` ``[b, s]`` (or ``[b]``); the result has the
    shape of ``tokens`` and is computed in float32. The positions are taken in
    ``⌈s·b·V/LOGPROB_CHUNK_LOGITS⌉`` chunks (:data:`LOGPROB_CHUNK_LOGITS` logits each), each divided
    by ``T`` in the logits' dtype, upcast and normalised on its own, so no float32 copy of all
    the logits exists at once (SPEC §14.6 charges a log-prob pass ``4·T_mb·V/Pt`` bytes of
    logits; a bfloat16 model's pass now holds half that plus a chunk). Autograd flows through
    each chunk, so a training loss built on it is unchanged.

    Parameters
    ----------
    logits
        Unnormalised scores, any float dtype; a slice (``logits[:, sl]``) is not copied.
    tokens
        Indices into the last dimension of ``logits``.
    temperature
        ``T > 0``.

    Returns
    -------
    Tensor
        float32 log-probabilities, shaped like ``tokens``.
    """
    if not temperature > 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature!r}")
    if logits.dim() == 2:
        return token_logprobs(logits.unsqueeze(1), tokens.unsqueeze(1), temperature=temperature).squeeze(1)
    b, _, vocab = logits.shape
    step = max(1, LOGPROB_CHUNK_LOGITS // max(1, b * vocab))
    pieces = []
    # split, not slices: its backward concatenates the chunks' gradients once, where each
    # slice's would scatter into a zero tensor of all the logits (measured 1.8 × the step time
    # of a 7B model's training pass at 4 × 8k tokens on an H200)
    for chunk, toks in zip(logits.split(step, dim=1), tokens.split(step, dim=1)):
        if temperature != 1.0:
            chunk = chunk / temperature
        logp = torch.log_softmax(chunk.float(), dim=-1)
        pieces.append(logp.gather(-1, toks.unsqueeze(-1)).squeeze(-1))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


def in_token_chunks(
    fn: Callable[[Tensor, Tensor], tuple[Tensor, ...]],
    hidden: Tensor,
    tokens: Tensor,
    chunk: int,
    *,
    checkpoint: bool = False,
) -> tuple[Tensor, ...]:
    """``fn`` over ``chunk`` tokens of a microbatch at a time (SPEC §14.6's ``c``): the ``b × r``
    positions of ``hidden`` ``[b, r, d]`` and ``tokens`` ``[b, r]`` taken in order, ``[1, c, d]``
    and ``[1, c]`` per call; each of ``fn``'s ``[1, c]`` outputs is put back as ``[b, r]``.

    With ``checkpoint`` each call runs under :func:`torch.utils.checkpoint.checkpoint`: what it
    makes inside (the logits) is freed after it and recomputed in the backward. Flattening copies
    the hidden states of a sliced ``hidden`` (``b·r·d``, no logits).

    Raises
    ------
    TypeError, ValueError
        If ``chunk`` is not a positive integer (:func:`~rpeg.ir.errors.check_positive_int`).
    """
    check_positive_int("in_token_chunks: chunk", chunk)
    b, r, d = hidden.shape
    calls = zip(hidden.reshape(1, b * r, d).split(chunk, dim=1), tokens.reshape(1, b * r).split(chunk, dim=1))
    parts = [layer_checkpoint(fn, h, t, use_reentrant=False) if checkpoint else fn(h, t) for h, t in calls]
    return tuple(torch.cat(p, dim=1).reshape(b, r) for p in zip(*parts))


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
    return tokens, token_logprobs(scaled, tokens)  # already scaled: T = 1


@torch.no_grad()
def generate(
    model: StageModel,
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
