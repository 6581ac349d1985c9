"""Chapter 08 on the CPU: the grouped kernel's scheduler and visiting order as models, the reference, MoE problems.

The kernel (:mod:`gemmlab.kernels.grouped_sm90`) numbers the tiles of every group one after the other and
hands them out statically or from a counter; these functions compute what it does, on the CPU, so the
notebook and the tests can look at it without a GPU:

* :func:`visit_order` (its ranking of the groups, largest first), :func:`tile_order` (each CTA's tiles),
  :func:`descriptor_updates` (how often each CTA rewrites its descriptors), :func:`slot_reuse_margin` (whether
  a rewritten descriptor slot can still be under a queued load), :func:`finish_times` (static against dynamic
  scheduling on SMs of unequal speed) and :func:`mixed_order` (the mixed order's claims);
* :func:`reference`: the FP32 result of the ragged call;
* the problems of the tests and benchmarks: :func:`skewed_sizes` (a skewed router), :func:`random_problem`,
  :func:`random_pairs`, :func:`offsets_of`, :func:`flops_bytes`;
* figures: :func:`draw_tile_order`, :func:`draw_finish_times`.

The public calls are :func:`gemmlab.grouped_gemm` and :func:`gemmlab.grouped_gemm_list`
(:mod:`gemmlab.family.api`); what they decide, and why, is :mod:`gemmlab.family.heuristic_grouped`.
"""
from __future__ import annotations

from .family.configs import ORDER_MAX
from .family.problem import DTYPE_BITS
from .hardware import H100


def reference(a, b, offs):
    """FP32 reference of the ragged grouped GEMM (rows past ``offs[-1]`` are zero)."""
    import torch
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=torch.float32, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end].float() @ b[g].float()
        start = max(start, end)
    return out


def visit_order(m_sizes, by_size: bool = True) -> list[int]:
    """CPU model of :func:`gemmlab.kernels.grouped_sm90.rank_groups`: the groups in the order the kernel visits them.

    Largest first, ties by index; index order when ``by_size`` is off or there
    are more than :data:`gemmlab.family.configs.ORDER_MAX` groups.
    """
    groups = range(len(m_sizes))
    if not by_size or len(m_sizes) > ORDER_MAX:
        return list(groups)
    return sorted(groups, key=lambda g: (-m_sizes[g], g))


def tile_order(m_sizes, n: int, tile_m: int, tile_n: int, grid: int, by_size: bool = True, cluster: int = 1):
    """CPU model of the kernel's scheduler: for each CTA, its tiles as ``(group, m_tile, n_tile)``.

    Tiles are numbered group after group in :func:`visit_order` (largest group
    first), M fastest inside a group; CTA ``b`` takes ``b, b + grid, ...``.
    Groups with no rows have no tiles. With ``cluster = 2`` the numbered units
    are pairs of M-tiles: cluster ``c = b // 2`` takes units ``c, c + grid / 2,
    ...`` and its CTA of rank ``b % 2`` the pair's M-tile ``2 * pair + rank``,
    which lies past the group's rows when the group has an odd number of them.
    """
    order = []
    for g in visit_order(m_sizes, by_size):
        m = m_sizes[g]
        mu, nt = -(-m // (tile_m * cluster)), -(-n // tile_n)
        order += [(g, i % mu, i // mu) for i in range(mu * nt)]
    clusters = grid // cluster
    return [[(g, pair * cluster + b % cluster, nt) for g, pair, nt in order[b // cluster::clusters]]
            for b in range(clusters * cluster)]


def finish_times(tile_costs, speeds, dynamic: bool, ahead: bool = True) -> list[float]:
    """CPU model of when each CTA finishes: static (CTA ``b`` takes ``b, b + grid, ...``) or dynamic scheduling.

    ``tile_costs``: each tile's work, in the order tiles are numbered; ``speeds``: each CTA's rate (work per
    unit of time, e.g. the memory bandwidth its SM happens to get); ``len(speeds)`` is the grid. Dynamic: tile
    ``b`` first, then a CTA claims its next tile from the counter, with ``ahead`` when it *starts* a tile (the
    kernel's first version: a claimed tile waits for the tile in hand), else when it ends one (the kernel now
    claims :data:`gemmlab.scheduler.CLAIM_LEAD` k-blocks before, which this idealises). A model: the rates
    are constant and independent of how many CTAs are still running.
    """
    grid = len(speeds)
    if not dynamic:
        return [sum(tile_costs[b::grid]) / speeds[b] for b in range(grid)]
    import heapq
    if not ahead:  # the CTA that frees up first takes the next tile
        done = [0.0] * grid
        for b in range(min(grid, len(tile_costs))):
            done[b] = tile_costs[b] / speeds[b]
        free = [(done[b], b) for b in range(min(grid, len(tile_costs)))]
        heapq.heapify(free)
        for tile in range(grid, len(tile_costs)):
            t, b = heapq.heappop(free)
            done[b] = t + tile_costs[tile] / speeds[b]
            heapq.heappush(free, (done[b], b))
        return done
    nxt = grid  # the counter: the next unclaimed tile
    # (time the CTA starts a tile, CTA, the tile it starts)
    events = [(0.0, b, b) for b in range(min(grid, len(tile_costs)))]
    heapq.heapify(events)
    done = [0.0] * grid
    claimed = [None] * grid
    while events:
        t, b, tile = heapq.heappop(events)
        if nxt < len(tile_costs):  # claim the following tile now, work on it after this one
            claimed[b], nxt = nxt, nxt + 1
        else:
            claimed[b] = None
        end = t + tile_costs[tile] / speeds[b]
        done[b] = end
        if claimed[b] is not None:
            heapq.heappush(events, (end, b, claimed[b]))
    return done


def descriptor_updates(m_sizes, n: int, tile_m: int, tile_n: int, grid: int, by_size: bool = True) -> list[int]:
    """For each CTA, how many times its producer rewrites the A/B descriptors (once per group it enters)."""
    counts = []
    for tiles in tile_order(m_sizes, n, tile_m, tile_n, grid, by_size):
        groups = [g for g, _, _ in tiles]
        counts.append(sum(1 for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]))
    return counts


def slot_reuse_margin(visits, stages: int, slots: int) -> int | None:
    """CPU model of the producer's A/B descriptor slots: the fewest loads issued between a slot's last load and
    its rewrite, over every rewrite (None: no slot is ever rewritten). Safe when it is at least ``stages``
    (the kernel has :func:`gemmlab.family.configs.ab_slots` = ``stages + 1`` of them).

    ``visits``: the tiles one CTA's producer visits, in order, as ``(stream, group, k_blocks)`` (stream 0; the
    mixed order's light stream 1 has slots of its own). Load ``j`` goes into stage ``j % stages``; before issuing
    it the producer waits until load ``j - stages`` has been consumed (so has completed). A group change rewrites
    the stream's next slot before the group's first load ``j0``: the slot's previous load ``p`` has surely
    completed only if ``j0 - 1 - p >= stages`` (the wait before load ``j0 - 1`` covered load ``j0 - 1 - stages``).
    """
    last_group: dict = {}
    flips: dict = {}
    last_load: dict = {}  # (stream, slot) -> index of the last load that used it
    j, margin = 0, None
    for stream, group, k_blocks in visits:
        if k_blocks < 1:
            raise ValueError(f"every tile has at least one k-block; got {k_blocks}")
        if last_group.get(stream) != group:
            flips[stream] = flips.get(stream, 0) + 1
            key = (stream, flips[stream] % slots)
            if key in last_load:
                gap = j - 1 - last_load[key]
                margin = gap if margin is None else min(margin, gap)
            last_group[stream] = group
        key = (stream, flips[stream] % slots)
        j += k_blocks
        last_load[key] = j - 1
    return margin


def skewed_sizes(tokens: int, groups: int, seed: int = 0, alpha: float = 1.2) -> list[int]:
    """Tokens per expert from a skewed router: expert popularity ~ 1 / rank^alpha, then a multinomial draw.

    Popular experts get many tokens; with few tokens many experts get none (the
    benchmark's MoE sets; deterministic for a seed).
    """
    import torch
    g = torch.Generator().manual_seed(seed * 7919 + groups)
    weights = 1.0 / torch.arange(1, groups + 1, dtype=torch.float64) ** alpha
    weights = weights[torch.randperm(groups, generator=g)]
    picks = torch.multinomial(weights, tokens, replacement=True, generator=g)
    return torch.bincount(picks, minlength=groups).tolist()


def offsets_of(sizes, device="cuda"):
    """torch's ``offs`` for groups of ``sizes`` rows: their cumulative end rows, int32, on ``device``."""
    import itertools

    import torch
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device=device)


def random_problem(sizes, n: int, k: int, *, b_major: str = "k", dtype=None, seed: int = 0, extra_rows: int = 0,
                   device="cuda"):
    """Random ``(a, b, offs)`` in the ragged convention for groups of ``sizes`` rows (tests, benchmarks).

    ``b_major="k"``: the weights stored as nn.Linear does, (G, N, K), passed as the
    (G, K, N) view; ``"n"``: stored (G, K, N). ``extra_rows``: rows of ``a`` after
    the last group (the kernel must leave the output's rows there untouched).
    """
    import torch
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(sum(sizes) + extra_rows, k, device=device, dtype=dtype, generator=gen)
    if b_major == "k":
        b = torch.randn(len(sizes), n, k, device=device, dtype=dtype, generator=gen).transpose(1, 2)
    else:
        b = torch.randn(len(sizes), k, n, device=device, dtype=dtype, generator=gen)
    return a, b, offsets_of(sizes, device)


#: The list form's mixed problems (M, N, K) of the check and the tests: an empty one, one below a tile, K not a
#: multiple of the tile, N not a multiple of 16.
LIST_SHAPES = ((130, 256, 64), (0, 128, 64), (7, 512, 1024), (300, 136, 200), (64, 64, 64))


def random_pairs(shapes, *, b_major: str = "k", seed: int = 0, device="cuda") -> list:
    """Random BF16 ``(a_i, b_i)`` for independent problems ``(M, N, K)`` in ``shapes`` (the list form).

    ``b_major="k"``: each b stored (N, K) as nn.Linear does, passed as its (K, N) view; ``"n"``: stored (K, N).
    """
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    pairs = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
        b = (torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen).t() if b_major == "k"
             else torch.randn(k, n, device=device, dtype=torch.bfloat16, generator=gen))
        pairs.append((a, b))
    return pairs


def flops_bytes(m_sizes, n: int, k: int, dtype: str = "bfloat16") -> tuple[int, int]:
    """FLOPs and the bytes that must move at least once: A and C rows, and the weights of non-empty groups."""
    esize = DTYPE_BITS[dtype] // 8
    tokens = sum(m_sizes)
    live = sum(1 for m in m_sizes if m > 0)
    return 2 * tokens * n * k, esize * (tokens * k + tokens * n + live * k * n)


def mixed_order(heavy: int, total: int, burst: int = 1) -> list[tuple[bool, int]]:
    """CPU twin of :func:`gemmlab.kernels.grouped_sm90.mixed_tile`: for each claim ``i`` in ``0 .. total - 1``,
    ``(light, tile)``. Claims come in blocks of ``burst``; each block takes its share of the ``heavy`` heavy tiles
    (numbers ``0 .. heavy - 1``) first and then its share of the light ones (numbers ``heavy ..``), each stream in
    its own order."""
    out = []
    for i in range(total):
        j, r = divmod(i, burst)
        h0, h1 = (min(x * burst, total) * heavy // total for x in (j, j + 1))
        out.append((False, h0 + r) if r < h1 - h0 else (True, heavy + j * burst - h0 + r - (h1 - h0)))
    return out


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------


def draw_tile_order(m_sizes, n: int, tile_m: int, tile_n: int, grid: int, name: str = "08_tile_order",
                    cluster: int = 1):
    """Every tile of a grouped problem, coloured by the CTA that computes it, labelled with its turn.

    One panel per group (empty groups shown empty): rows are M tiles, columns N
    tiles. The label ``b:i`` is CTA ``b``'s ``i``-th tile; the heavy outline marks
    the tiles where a CTA enters a new group, i.e. rewrites its descriptors.
    With ``cluster = 2`` (the 2-CTA pairs, which visit the groups in index
    order, as :func:`gemmlab.family.heuristic_grouped.largest_first` has the kernel do), a hatched
    grey tile is one a pair's second CTA is handed past its group's rows.
    """
    import matplotlib.pyplot as plt

    from .figures import new_figure, save

    order = tile_order(m_sizes, n, tile_m, tile_n, grid, by_size=cluster == 1, cluster=cluster)
    where = {}
    for cta, tiles in enumerate(order):
        for i, t in enumerate(tiles):
            new_group = i == 0 or tiles[i - 1][0] != t[0]
            where[t] = (cta, i, new_group)
    nt = -(-n // tile_n)
    slots = [-(-m // (tile_m * cluster)) * cluster for m in m_sizes]  # M-tiles handed out, per group
    widths = [nt] * len(m_sizes)
    fig, axes = new_figure(1, len(m_sizes), figsize=(0.9 * sum(widths) + 1.5, 3.2), squeeze=False,
                           gridspec_kw={"width_ratios": widths})
    cmap = plt.get_cmap("tab10")
    tallest = max(max(slots), 1)
    for g, (ax, m) in enumerate(zip(axes[0], m_sizes)):
        mt = -(-m // tile_m)
        for mi in range(slots[g]):
            for ni in range(nt):
                cta, i, new = where[(g, mi, ni)]
                past = mi >= mt
                ax.add_patch(plt.Rectangle((ni, mi), 1, 1, facecolor="lightgrey" if past else cmap(cta % 10),
                                           alpha=0.55, hatch="//" if past else None,
                                           edgecolor="black", lw=2.2 if new else 0.6))
                ax.text(ni + 0.5, mi + 0.5, f"{cta}:{i}", ha="center", va="center", fontsize=8)
        ax.set_xlim(0, nt)
        ax.set_ylim(tallest, 0)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"group {g}: M = {m}" + (" (no tiles)" if mt == 0 else ""), fontsize=9)
    pairs = f" in clusters of {cluster} along M (hatched: past the group's rows)" if cluster > 1 else ""
    fig.suptitle(f"{grid} CTAs{pairs}, tiles {tile_m} x {tile_n}, N = {n}; label = CTA:turn; thick edge = "
                 f"descriptor rewrite", fontsize=9, y=1.0)
    return save(fig, name)


def draw_finish_times(tiles: int = 576, grid: int = H100.sms, spread: float = 0.2, seed: int = 0,
                      name: str = "08_finish_times"):
    """CPU model (:func:`gemmlab.grouped_model.finish_times`): when each CTA finishes, static against dynamic
    (claiming the next tile as a tile starts, or as it ends).

    ``tiles`` equal tiles on ``grid`` CTAs whose rates are drawn uniformly within ``1 +- spread`` (seeded):
    an assumption standing in for SMs that get unequal memory bandwidth, not a measurement.
    """
    import random
    from .figures import new_figure, save

    rng = random.Random(seed)
    speeds = [1 + spread * (2 * rng.random() - 1) for _ in range(grid)]
    even = tiles / sum(speeds)  # every CTA busy until the same moment
    fig, ax = new_figure(figsize=(7.2, 3.8))
    for dynamic, ahead, color, label in (
            (False, True, "tab:orange", "static: CTA b takes b, b + grid, ..."),
            (True, True, "tab:blue", "dynamic, the next tile claimed as a tile starts"),
            (True, False, "tab:green", "dynamic, the next tile claimed as a tile ends")):
        t = sorted(finish_times([1.0] * tiles, speeds, dynamic, ahead))
        ax.step(range(grid), [x / even for x in t], where="post", color=color,
                label=f"{label} (last: {max(t) / even:.2f})")
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="even split of the work")
    ax.set_xlabel(f"CTAs, sorted by finish time ({tiles} equal tiles, {grid} CTAs, rates 1 +- {spread:.0%})")
    ax.set_ylabel("finish time / even split")
    ax.set_title("CPU model: when the CTAs finish", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, alpha=0.3)
    return save(fig, name)
