"""The model check of bench/engine_kv.py: a random-weight Llama-shaped model's real KV cache
through the store. Prefill (the recompute), store the cache's pages, load them into fresh
tensors, decode one token from each cache and compare the logits, with the controls that tell a
store fault from the model's own nondeterminism (docs/benchmarks.md, "GPU engines on an H200").
Also the small helpers engine_kv.py shares with it."""

import copy
import time

import torch


def ratio(a, b):
    return a / b if a and b else None


def same_bytes(a, b):
    """Byte equality (a float compare would call NaN patterns unequal)."""
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def cache_pairs(pkv):
    """(kind, [(K, V)] per layer) from whatever past_key_values this transformers returns."""
    if isinstance(pkv, (tuple, list)):
        return "tuple", [(layer[0], layer[1]) for layer in pkv]
    layers = getattr(pkv, "layers", None)
    if layers and isinstance(getattr(layers[0], "keys", None), torch.Tensor):
        return type(pkv).__name__, [(layer.keys, layer.values) for layer in layers]
    if isinstance(getattr(pkv, "key_cache", None), list):
        return type(pkv).__name__, list(zip(pkv.key_cache, pkv.value_cache))
    if hasattr(pkv, "to_legacy_cache"):
        return type(pkv).__name__, [(layer[0], layer[1]) for layer in pkv.to_legacy_cache()]
    return type(pkv).__name__, [(pkv[i][0], pkv[i][1]) for i in range(len(pkv))]


def build_cache(kind, pairs, config):
    """A cache of the kind the model returned, holding these tensors."""
    if kind == "tuple":
        return tuple((k, v) for k, v in pairs)
    import transformers
    cls = getattr(transformers, kind, None) or transformers.DynamicCache
    try:  # as the model makes its own (transformers 5 builds the layers from the config)
        cache = cls(config=config)
    except TypeError:
        cache = cls()
    for layer, (k, v) in enumerate(pairs):
        cache.update(k, v, layer)
    return cache


def build_model(args, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    heads = 32
    if heads % args.kv_heads:
        raise ValueError(f"--kv-heads {args.kv_heads} does not divide 32 attention heads")
    hidden = heads * args.head_dim
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden,
                         intermediate_size=int(hidden * 3.5) // 256 * 256 or 256,
                         num_hidden_layers=args.layers, num_attention_heads=heads,
                         num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                         max_position_embeddings=max(4096, args.prompt_tokens + 64))
    previous = torch.get_default_dtype()
    try:
        try:
            torch.set_default_dtype(dtype)
        except (TypeError, RuntimeError):
            pass
        try:
            with torch.device(device):
                model = LlamaForCausalLM(config)
        except (AttributeError, TypeError):  # torch without the device context manager
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(device=device, dtype=dtype).eval()
    # Own deterministic weights, whatever this transformers initialised (or left empty).
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return config, model


def model_check(args, layout, kv, prefix, pin_src, pin_dst, device):
    """Prefill (the recompute), store its cache, load it into fresh tensors, decode one token
    from each cache and compare the logits."""
    try:
        import transformers
    except ImportError as e:
        return {"available": False, "reason": f"transformers does not import: {e}"}
    dtype = layout.dtype
    out = {"available": True, "transformers": transformers.__version__, "device": device}
    try:
        config, model = build_model(args, device, dtype)
    except Exception as e:  # noqa: BLE001 - any version mismatch: reported, not fatal
        return {"available": False, "reason": f"cannot build the model: {e!r}"}
    out["model"] = {"hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
                    "attention_heads": config.num_attention_heads,
                    "kv_heads": config.num_key_value_heads, "head_dim": args.head_dim,
                    "intermediate_size": config.intermediate_size, "vocab": config.vocab_size,
                    "params": sum(p.numel() for p in model.parameters())}
    gen = torch.Generator(device="cpu")
    gen.manual_seed(99)
    ids = torch.randint(0, config.vocab_size, (1, layout.tokens), generator=gen).to(device)

    def prefill():
        with torch.no_grad():
            return model(input_ids=ids, use_cache=True)

    sync(device)
    t0 = time.perf_counter()
    result = prefill()
    sync(device)
    out["prefill_first_ms"] = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(args.repeats):
        del result
        sync(device)
        t0 = time.perf_counter()
        result = prefill()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    out["prefill_ms_all"] = times
    out["prefill_ms"] = min(times)
    next_ids = result.logits[:, -1].argmax(-1, keepdim=True)
    kind, pairs = cache_pairs(result.past_key_values)
    out["cache_kind"] = kind
    want = (1, layout.heads, layout.tokens, layout.head_dim)
    if len(pairs) != layout.layers or tuple(pairs[0][0].shape) != want:
        return dict(out, available=False, reason=f"unexpected cache: {len(pairs)} layers of "
                    f"{tuple(pairs[0][0].shape)}, expected {layout.layers} of {want}")
    objects = layout.objects(f"{prefix}/model")

    # Store: pack the pages, stage them in pinned (or plain) host memory, exist + put.
    sync(device)
    t0 = time.perf_counter()
    paged = layout.pack(pairs)
    pin_src.copy_(paged.view(-1).view(torch.uint8), non_blocking=True)
    sync(device)
    kv.exist(objects, 0)
    kv.put(objects, pin_src.data_ptr())
    out["store_ms"] = (time.perf_counter() - t0) * 1e3
    control = [(k.clone(), v.clone()) for k, v in pairs]
    del paged

    # Load into fresh tensors: exist + get into host, to the device, unpack to K and V.
    pin_dst.zero_()
    sync(device)
    t0 = time.perf_counter()
    kv.exist(objects, 1)
    kv.get(objects, pin_dst.data_ptr())
    t_get = time.perf_counter()
    staged = torch.empty(layout.total, dtype=torch.uint8, device=device)
    staged.copy_(pin_dst, non_blocking=True)
    loaded = layout.unpack(staged.view(dtype).view(layout.shape))
    sync(device)
    out["load_ms"] = (time.perf_counter() - t0) * 1e3
    out["load_get_ms"] = (t_get - t0) * 1e3
    del staged
    kv.remove(objects)
    out["kv_bytes"] = layout.total
    out["kv_equal"] = all(same_bytes(a[0], b[0]) and same_bytes(a[1], b[1])
                          for a, b in zip(control, loaded))
    out["prefill_over_load"] = ratio(out["prefill_ms"], out["load_ms"])

    position = torch.tensor([[layout.tokens]], device=device)

    def decode(cache):
        with torch.no_grad():
            step = model(input_ids=next_ids, past_key_values=cache, use_cache=True,
                         position_ids=position)
        return step.logits[:, -1].clone()

    original_copy = copy.deepcopy(result.past_key_values)
    out["cache_strides"] = {"original": list(pairs[0][0].stride()),
                            "rebuilt": list(cache_pairs(build_cache(kind, control[:1], config))[1][0][0].stride())}
    reference = decode(result.past_key_values)  # the original cache, as the prefill left it
    got = decode(build_cache(kind, loaded, config))
    rebuilt = decode(build_cache(kind, control, config))
    out["logits_equal"] = torch.equal(reference, got)
    # The original's bytes through the same rebuild: tells a store fault from a rebuild one.
    out["rebuild_control_equal"] = torch.equal(reference, rebuilt)
    # The store's bytes against the original's through the same rebuild: only a store fault
    # makes these differ.
    out["logits_equal_rebuilt"] = torch.equal(got, rebuilt)
    out["reference_repeatable"] = torch.equal(reference, decode(original_copy))
    out["rebuilt_repeatable"] = torch.equal(rebuilt, decode(build_cache(kind, control, config)))
    out["logits_max_abs_diff"] = float((reference.float() - got.float()).abs().max())
    del original_copy
    out["logits_finite"] = bool(torch.isfinite(reference).all())
    out["next_token"] = int(reference.argmax(-1)[0])
    model = result = None  # the model and its activations: freed before empty_cache
    if device == "cuda":
        torch.cuda.empty_cache()
    return out
