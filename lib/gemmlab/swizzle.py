"""Chapter 04 (the model): where TMA puts each 16-byte chunk of a tile in shared memory.

What it teaches
    Shared memory has 32 banks of 4 bytes: a 128-byte *line* touches every
    bank once, and a 16-byte *chunk* covers a group of four banks (a "bank
    group"; 8 per line). A tile stored row after row with 128-byte rows puts
    column chunk ``c`` of every row in the same bank group, so eight threads
    reading one column of eight rows (what an 8-address phase of ``ldmatrix``
    does) queue up eight deep. TMA's swizzle modes fix this by permuting the
    chunks of each line: the chunk index (address bits 4..6) is XORed with the
    line index (address bits 7..9), restricted to 1, 2 or 3 bits:

    ==========  ==============================================  ===============
    mode        physical byte address                          CuTe swizzle
    ==========  ==============================================  ===============
    ``none``    ``a``                                           ``Swizzle<0,4,3>``
    ``32B``     ``a ^ (((a >> 7) & 1) << 4)``                   ``Swizzle<1,4,3>``
    ``64B``     ``a ^ (((a >> 7) & 3) << 4)``                   ``Swizzle<2,4,3>``
    ``128B``    ``a ^ (((a >> 7) & 7) << 4)``                   ``Swizzle<3,4,3>``
    ==========  ==============================================  ===============

    ``a`` is the byte offset from a shared-memory base aligned to the
    pattern's repeat (1024 bytes covers every mode). CuTe's
    ``Swizzle<B, M, S>`` XORs the ``B`` bits starting at bit ``M + S`` into
    the ``B`` bits starting at bit ``M``: here ``M = 4`` (16-byte chunks),
    ``S = 3`` (the line index starts 3 bits higher, at bit 7 = 128 bytes).
    The *span* of a mode (32, 64 or 128 bytes) is the longest row TMA may
    write with it: rows of exactly one span are the layouts GEMMs use.

    A box row *shorter* than the span is not packed against the next one: TMA
    gives each row a whole span of shared memory (its *pitch*) and swizzles
    that, so the rest of the span is padding. A 16 x 32 FP16 box (64-byte
    rows) loaded with the 128B swizzle takes 16 x 128 = 2048 bytes of shared
    memory for its 1024 data bytes, row ``r`` chunk ``c`` at bank group
    ``c ^ (r & 7)`` of line ``r``, while the load completed 1024 bytes on its
    mbarrier (a probe on an H200). For the 32B and 64B modes the same rule is
    this model's prediction until ``test_hardware_swizzle_short_rows`` in
    ``tests/test_tma.py`` has run on a GPU. :func:`row_pitch` and
    :func:`smem_bytes` give the footprint; :func:`tile_layout`,
    :func:`expected_smem` and :func:`line_map` place the padding.

    The XOR is its own inverse, so the same function maps logical to physical
    and physical to logical.

    WGMMA reads its operands from shared memory itself, in a pattern NVIDIA
    does not document: for it the swizzle is a layout its descriptor must name
    (chapter 06), not a bank-conflict fix this model can measure. The model's
    conflict counts are about threads' reads such as ``ldmatrix``.

What it adds over chapter 01
    Chapter 01 measured bank conflicts and removed them by padding rows. A
    swizzle removes them without wasting a byte, and because TMA (and WGMMA)
    apply it in hardware, it is the layout every Hopper GEMM keeps its
    operand tiles in. ``gemmlab.tma`` checks this model against the bytes a
    real TMA load writes.
"""
from __future__ import annotations

import numbers

from .checks import check_choice, check_int

#: The swizzle modes of a tensor map, in the order of the CUDA enum (CU_TENSOR_MAP_SWIZZLE_*).
MODES = ("none", "32B", "64B", "128B")
#: Bits of the chunk index that are XORed (CuTe's ``B`` in ``Swizzle<B, 4, 3>``).
SWIZZLE_BITS = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
#: The longest inner box row, in bytes, that each swizzle mode may write (none: no limit from the swizzle).
SPAN = {"none": None, "32B": 32, "64B": 64, "128B": 128}
#: Shared-memory alignment the pattern repeats at: 8 lines of 128 bytes.
PATTERN_BYTES = 1024
CHUNK = 16  # bytes per chunk: one bank group (4 banks x 4 bytes)
LINE = 128  # bytes per line: all 32 banks once
BANK_GROUPS = LINE // CHUNK


def cute_swizzle(mode: str) -> tuple[int, int, int]:
    """The CuTe ``Swizzle<B, M, S>`` of ``mode`` as ``(B, M, S)``: ``make_swizzle(*cute_swizzle(mode))``."""
    check_choice("mode", mode, MODES)
    return (SWIZZLE_BITS[mode], 4, 3)


def swizzle_offset(mode: str, byte_offset):
    """The physical shared-memory byte offset where TMA puts logical byte ``byte_offset``.

    ``byte_offset`` is a non-negative int (numpy integers too) or an integer
    numpy array (element-wise).
    """
    check_choice("mode", mode, MODES)
    _check_offsets(byte_offset)
    mask = (1 << SWIZZLE_BITS[mode]) - 1
    return byte_offset ^ (((byte_offset >> 7) & mask) << 4)


def _check_offsets(byte_offset) -> None:
    if isinstance(byte_offset, numbers.Integral) and not isinstance(byte_offset, bool):
        if byte_offset < 0:
            raise ValueError(f"byte_offset must be non-negative; got {byte_offset}")
        return
    import numpy as np

    if not isinstance(byte_offset, np.ndarray):
        raise TypeError(f"byte_offset must be an int or an integer numpy array; got {type(byte_offset).__name__}")
    if byte_offset.dtype.kind not in "iu":
        raise TypeError(f"byte_offset must be an integer numpy array; got dtype {byte_offset.dtype}")
    if byte_offset.size and byte_offset.min() < 0:
        raise ValueError(f"byte_offset must be non-negative; got an entry of {byte_offset.min()}")


def _check_rows(rows: int, row_bytes: int, mode: str) -> None:
    check_int("rows", rows, lo=1)
    check_int("row_bytes", row_bytes, lo=CHUNK, multiple_of=CHUNK)
    span = SPAN[mode]
    if span is not None and row_bytes > span:
        raise ValueError(f"row_bytes must be <= {span} for swizzle {mode} (the swizzle span); got {row_bytes}")


def row_pitch(mode: str, row_bytes: int) -> int:
    """Bytes of shared memory one box row of ``row_bytes`` occupies: the swizzle span if the row is shorter.

    Unswizzled rows are packed back to back (pitch = ``row_bytes``); with a
    swizzle, a row shorter than the span still takes a whole span.
    """
    check_choice("mode", mode, MODES)
    _check_rows(1, row_bytes, mode)
    span = SPAN[mode]
    return row_bytes if span is None else max(row_bytes, span)


def smem_bytes(mode: str, rows: int, row_bytes: int) -> int:
    """Shared-memory footprint of a ``rows`` x ``row_bytes`` box loaded with ``mode``: ``rows`` x the pitch.

    Equal to the box's bytes when rows are one span long (or unswizzled);
    larger, padding included, when they are shorter than the span.
    """
    _check_rows(rows, row_bytes, mode)
    return rows * row_pitch(mode, row_bytes)


def _physical(mode: str, rows: int, row_bytes: int):
    """Physical byte offset of every logical byte of the box, shape ``(rows, row_bytes)``."""
    import numpy as np

    r, x = np.meshgrid(np.arange(rows), np.arange(row_bytes), indexing="ij")
    return swizzle_offset(mode, r * row_pitch(mode, row_bytes) + x)


def tile_layout(mode: str, rows: int, row_bytes: int):
    """Where each 16-byte chunk of a ``rows`` x ``row_bytes`` tile lands: ``(line, bank_group)`` per chunk.

    Returns an int numpy array of shape ``(rows, row_bytes // 16, 2)``: for
    the chunk in box row ``r``, column chunk ``c``, the 128-byte line and the
    bank group (0..7, banks ``4g .. 4g + 3``) it occupies in shared memory.
    Rows shorter than the swizzle span start a span apart (:func:`row_pitch`).
    """
    import numpy as np

    check_choice("mode", mode, MODES)
    _check_rows(rows, row_bytes, mode)
    phys = _physical(mode, rows, row_bytes)[:, ::CHUNK]
    return np.stack([phys // LINE, (phys % LINE) // CHUNK], axis=-1)


def data_mask(mode: str, rows: int, row_bytes: int):
    """Boolean numpy array over the :func:`smem_bytes` footprint: True where a data byte lands, False on padding."""
    import numpy as np

    check_choice("mode", mode, MODES)
    _check_rows(rows, row_bytes, mode)
    mask = np.zeros(smem_bytes(mode, rows, row_bytes), dtype=bool)
    mask[_physical(mode, rows, row_bytes).reshape(-1)] = True
    return mask


def expected_smem(tile_bytes, mode: str, fill: int = 0):
    """The bytes TMA writes into shared memory for a tile, as a flat uint8 numpy array.

    ``tile_bytes``: a 2-D uint8 array (box rows x inner box bytes), the tile as
    it is in global memory (out-of-bounds elements already zero). The array
    covers the :func:`smem_bytes` footprint; padding bytes (rows shorter than
    the swizzle span) hold ``fill``: the model says only where data goes, so
    compare the hardware's bytes where :func:`data_mask` is True.
    """
    import numpy as np

    check_choice("mode", mode, MODES)
    tile_bytes = np.asarray(tile_bytes)
    if tile_bytes.dtype != np.uint8 or tile_bytes.ndim != 2:
        raise ValueError(f"tile_bytes must be a 2-D uint8 array; got {tile_bytes.dtype} of shape {tile_bytes.shape}")
    check_int("fill", fill, lo=0, hi=255)
    rows, row_bytes = tile_bytes.shape
    _check_rows(rows, row_bytes, mode)
    out = np.full(smem_bytes(mode, rows, row_bytes), fill, dtype=np.uint8)
    out[_physical(mode, rows, row_bytes).reshape(-1)] = tile_bytes.reshape(-1)
    return out


def column_read_ways(mode: str, row_bytes: int, chunk: int = 0, rows: int = 8) -> int:
    """Bank-conflict ways when ``rows`` threads each read chunk ``chunk`` of consecutive box rows.

    This is one 8-address phase of ``ldmatrix`` on a tile whose rows are
    ``row_bytes`` long: 1 means every thread hits its own bank group (one
    wavefront), 8 means all eight queue on the same group. Rows shorter than
    the swizzle span are a span apart (:func:`row_pitch`), as TMA puts them.
    """
    _check_rows(rows, row_bytes, mode)
    check_int("chunk", chunk, lo=0, hi=row_bytes // CHUNK - 1)
    layout = tile_layout(mode, rows, row_bytes)
    hits: dict[int, int] = {}
    for r in range(rows):
        g = int(layout[r, chunk, 1])
        hits[g] = hits.get(g, 0) + 1
    return max(hits.values())


#: The swizzle mode whose span equals a row length.
MODE_FOR_ROW_BYTES = {32: "32B", 64: "64B", 128: "128B"}


def conflict_table(row_bytes_list=(32, 64, 128)) -> list[dict]:
    """Worst ways of a column read (8 rows), unswizzled against the swizzle whose span is the row length."""
    rows = []
    for rb in row_bytes_list:
        check_choice("row_bytes_list[i]", rb, tuple(MODE_FOR_ROW_BYTES))
        mode = MODE_FOR_ROW_BYTES[rb]
        rows.append({
            "row bytes": rb,
            "mode": mode,
            "ways none": max(column_read_ways("none", rb, c) for c in range(rb // CHUNK)),
            "ways swizzled": max(column_read_ways(mode, rb, c) for c in range(rb // CHUNK)),
        })
    return rows


def line_map(mode: str, row_bytes: int | None = None, lines: int = 8):
    """For each 128-byte line and bank group, the ``(box row, chunk)`` that TMA puts there.

    ``row_bytes`` defaults to the mode's span (128 for ``none``). Returns an
    int numpy array of shape ``(lines, 8, 2)``: the data behind :func:`draw_swizzle`.
    Padding (rows shorter than the swizzle span) is ``(-1, -1)``.
    """
    import numpy as np

    check_choice("mode", mode, MODES)
    row_bytes = row_bytes or SPAN[mode] or LINE
    check_int("lines", lines, lo=1)
    n = lines * LINE
    _check_rows(1, row_bytes, mode)
    pitch = row_pitch(mode, row_bytes)
    phys = np.arange(0, n, CHUNK)
    logical = swizzle_offset(mode, phys)  # an involution: the same XOR undoes it
    row, chunk = logical // pitch, (logical % pitch) // CHUNK
    pad = chunk >= row_bytes // CHUNK
    out = np.stack([np.where(pad, -1, row), np.where(pad, -1, chunk)], axis=-1)
    return out.reshape(lines, BANK_GROUPS, 2)


def draw_swizzle(mode: str, row_bytes: int | None = None):
    """Draw :func:`line_map` for one mode: 8 lines x 8 bank groups, each cell "row.chunk", coloured by chunk.

    Saved as ``figures/04_swizzle_<mode>.png``; returns ``(path, data)`` with
    ``data`` the ``(lines, 8, 2)`` array drawn.
    """
    from .figures import new_figure, save

    data = line_map(mode, row_bytes)
    fig, ax = new_figure(figsize=(5, 4))
    _draw_map(ax, mode, data, row_bytes or SPAN[mode] or LINE)
    return save(fig, f"04_swizzle_{mode}"), data


_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3", "#8C8C8C"]


def _draw_map(ax, mode, data, row_bytes):
    from matplotlib.patches import Rectangle

    lines = data.shape[0]
    for line in range(lines):
        for g in range(BANK_GROUPS):
            row, chunk = (int(v) for v in data[line, g])
            colour = "#DDDDDD" if chunk < 0 else _COLORS[chunk % len(_COLORS)]  # padding: light grey
            ax.add_patch(Rectangle((g, line), 1, 1, facecolor=colour, edgecolor="white", lw=1.5))
            ax.text(g + 0.5, line + 0.5, "pad" if chunk < 0 else f"{row}.{chunk}", ha="center", va="center",
                    fontsize=8, color="grey" if chunk < 0 else "white", fontweight="bold")
    ax.set_xlim(0, BANK_GROUPS)
    ax.set_ylim(lines, 0)
    ax.set_xticks([g + 0.5 for g in range(BANK_GROUPS)])
    ax.set_xticklabels([f"{4 * g}-{4 * g + 3}" for g in range(BANK_GROUPS)], fontsize=7, rotation=45)
    ax.set_yticks([line + 0.5 for line in range(lines)])
    ax.set_yticklabels([str(line) for line in range(lines)], fontsize=8)
    ax.set_xlabel("banks (one 16-byte bank group per column)", fontsize=8)
    ax.set_ylabel("128-byte line of shared memory", fontsize=8)
    ax.set_title(f"swizzle {mode}: rows of {row_bytes} B, Swizzle<{SWIZZLE_BITS[mode]},4,3>", fontsize=9)


def draw_swizzle_modes(modes=MODES):
    """All modes side by side (``figures/04_swizzle_modes.png``); returns ``(path, {mode: data})``.

    Each cell says which ``box row . chunk`` lands in that bank group; the
    colour is the chunk (the tile's column of 16 bytes). A column of one
    colour is a bank conflict waiting to happen.
    """
    from .figures import new_figure, save

    for m in modes:
        check_choice("modes[i]", m, MODES)
    fig, axes = new_figure(1, len(modes), figsize=(4.2 * len(modes), 4.4), squeeze=False)
    datas = {}
    for ax, m in zip(axes[0], modes):
        datas[m] = line_map(m)
        _draw_map(ax, m, datas[m], SPAN[m] or LINE)
    fig.suptitle("Which 16-byte chunk of the tile TMA puts in each bank group (cell: box row . chunk)", fontsize=11)
    return save(fig, "04_swizzle_modes"), datas
