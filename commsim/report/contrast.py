"""Colour contrast as WCAG 2.1 defines it (W3C, Web Content Accessibility Guidelines 2.1,
definitions "relative luminance" and "contrast ratio"; success criterion 1.4.3 asks 4.5:1 for
normal text, level AA): the report picks each cell's text colour by it instead of by eye."""

from __future__ import annotations

AA_NORMAL_TEXT = 4.5

__all__ = ["AA_NORMAL_TEXT", "contrast", "luminance", "readable_on", "parse_hex"]


def parse_hex(colour: str) -> tuple[int, int, int]:
    """"#rrggbb" or "#rgb" -> (r, g, b) in 0..255."""
    h = colour.lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    if len(h) != 6:
        raise ValueError(f"not a #rrggbb colour: {colour!r}")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def luminance(colour: str) -> float:
    """Relative luminance: sRGB channels linearised (threshold 0.04045 as in the sRGB
    standard IEC 61966-2-1; WCAG 2.1's text says 0.03928, the same for 8-bit values)."""
    def lin(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(c) for c in parse_hex(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """(L1 + 0.05) / (L2 + 0.05), L1 the lighter."""
    la, lb = luminance(a), luminance(b)
    hi, lo = max(la, lb), min(la, lb)
    return (hi + 0.05) / (lo + 0.05)


def _mix(colour: str, toward: str, t: float) -> str:
    a, b = parse_hex(colour), parse_hex(toward)
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))


def readable_on(background: str, minimum: float = AA_NORMAL_TEXT) -> tuple[str, str]:
    """(background, text colour) with at least `minimum` contrast: near-black or white text,
    whichever contrasts more; if neither reaches it, the background is shaded toward the
    opposite of the text in small steps until it does (a backend's own colour stays
    recognisable, only darker or lighter)."""
    dark, light = "#111111", "#ffffff"
    text = dark if contrast(background, dark) >= contrast(background, light) else light
    away = light if text == dark else "#000000"
    bg = background
    for step in range(1, 21):
        if contrast(bg, text) >= minimum:
            return bg, text
        bg = _mix(background, away, step / 20)
    return bg, text
