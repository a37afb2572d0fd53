"""Small text charts for the demos: a curve and a histogram, in plain ASCII."""

from __future__ import annotations

from collections import Counter


def ascii_curve(values: list[float], width: int = 60, height: int = 8, low: float = 0.0, high: float = 1.0) -> str:
    """`values` averaged into `width` columns and drawn as a column chart between `low` and `high`."""
    if not values:
        return "(no values)"
    width = min(width, len(values))
    columns = [values[len(values) * c // width: len(values) * (c + 1) // width] for c in range(width)]
    means = [sum(col) / len(col) for col in columns]
    rows = []
    for level in range(height, 0, -1):
        threshold = low + (high - low) * (level - 0.5) / height
        label = f"{high:4.2f}" if level == height else ""
        rows.append(f"{label:>6} |" + "".join("#" if m >= threshold else " " for m in means))
    rows.append(f"{low:>6.2f} +" + "-" * width)
    rows.append(f"{'':>6}  step 1{' ' * max(1, width - 6 - len(str(len(values))))}{len(values)}")
    return "\n".join(rows)


def histogram(counts: Counter, label: str = "", bar: int = 40) -> str:
    """One line per key, with a bar scaled to the largest count."""
    if not counts:
        return "(nothing counted)"
    most = max(counts.values())
    return "\n".join(f"  {label}{key}: {counts[key]:>6}  {'#' * max(1, bar * counts[key] // most)}"
                     for key in sorted(counts))
