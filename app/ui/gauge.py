"""The live acceptance gauge: how well the draft is doing, for a side panel."""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QPainter,
    QPainterPath,
    QPaintEvent,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.engine.live import LiveSnapshot
from app.engine.types import Origin, speedup_missing
from app.ui.transcript_style import ORIGIN_COLORS

# Mid-tone accents, readable on light and dark windows alike.
RECENT_TICK = QColor("#f59e0b")
LIFETIME_TICK = QColor("#a855f7")
# The transcript's colours for the same tokens, opaque: a bar is filled, not tinted.
DRAFT_SOURCE = QColor(ORIGIN_COLORS[Origin.DRAFT].rgb())
HEAD_SOURCE = QColor(ORIGIN_COLORS[Origin.MTP].rgb())
LOOKUP_SOURCE = QColor(ORIGIN_COLORS[Origin.LOOKUP].rgb())

PAD = 10.0
STROKE = 14.0  # thickness of the arc
OVERHANG = 4.0  # how far ticks stick out of the arc
GAP = 8.0  # between sections
BAR = 8.0  # height of the source-mix bar
SWATCH = 8.0  # legend colour squares
MIN_RADIUS = 50.0
MAX_RADIUS = 120.0
CHART_MIN = 36.0
CHART_MAX = 110.0
CHART_HINT = 90.0  # chart height at the size hint

EMPTY_TEXT = "No drafting yet"
SCALE_CAPTION = "this reply"  # under the big figure: whose acceptance it is
# Legends are laid out for their widest text, so they do not jump as figures change.
TICK_LEGEND = (("recent 100%", RECENT_TICK), ("lifetime 100%", LIFETIME_TICK))
SOURCE_LEGEND = (("draft 100%", DRAFT_SOURCE), ("lookup 100%", LOOKUP_SOURCE))
HEAD_LEGEND = (("MTP head 100%", HEAD_SOURCE), ("lookup 100%", LOOKUP_SOURCE))

LEFT = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
CENTER = Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignVCenter


def percent(value: float | None) -> str:
    """A share as whole percent (``"72%"``), or ``"—"`` when unknown."""
    return "—" if value is None else f"{value * 100:.0f}%"


def speedup_text(snapshot: LiveSnapshot) -> str:
    """``"1.42× plain"``, or why there is none (no plain speed yet, a reply too short)."""
    if snapshot.speedup is not None:
        return f"{snapshot.speedup:.2f}× plain"
    return speedup_missing(snapshot.baseline_tps, snapshot.tokens)


def k_text(snapshot: LiveSnapshot) -> str:
    """``"k 5 (auto)"`` or ``"k 4"``; ``"—"`` before any round."""
    if snapshot.k is None:
        return "—"
    return f"k {snapshot.k} (auto)" if snapshot.auto else f"k {snapshot.k}"


NOT_REPORTED_TEXT = "Acceptance not reported"


def summarize(snapshot: LiveSnapshot | None, empty: str = EMPTY_TEXT) -> str:
    """One line of the gauge's figures, for screen readers and tooltips.

    For example ``"Acceptance 70% this reply (recent 72%, lifetime 68%),
    4.5 tok/s, 1.41× plain, k 4"``; unknown figures are left out. ``empty``
    is what an unknown acceptance of this reply reads as.
    """
    if snapshot is None:
        return empty
    s = snapshot
    scopes = [
        f"{name} {percent(value)}"
        for name, value in (("recent", s.rolling_acceptance), ("lifetime", s.lifetime_acceptance))
        if value is not None
    ]
    message = s.message_acceptance
    head = empty if message is None else f"Acceptance {percent(message)} this reply"
    if scopes:
        head += f" ({', '.join(scopes)})"
    parts = [head]
    if s.tps is not None:
        parts.append(f"{s.tps:.1f} tok/s")
        speedup = speedup_text(s)
        parts.append(speedup if s.speedup is not None else f"speedup: {speedup}")
    if s.k is not None:
        parts.append(k_text(s))
    if s.lookup_accepted:
        parts.append(f"{percent(s.lookup_share)} from prompt lookup")
    return ", ".join(parts)


def _blend(a: QColor, b: QColor, t: float) -> QColor:
    """``a`` moved a share ``t`` of the way towards ``b``."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * t,
        a.greenF() + (b.greenF() - a.greenF()) * t,
        a.blueF() + (b.blueF() - a.blueF()) * t,
    )


def _scaled(font: QFont, factor: float) -> QFont:
    """A copy of ``font`` at ``factor`` times its size, in points or pixels."""
    scaled = QFont(font)
    if font.pointSizeF() > 0:
        scaled.setPointSizeF(max(font.pointSizeF() * factor, 6.0))
    else:
        scaled.setPixelSize(max(round(font.pixelSize() * factor), 8))
    return scaled


class GaugeWidget(QWidget):
    """This reply's acceptance on an arc, with speed, k, source mix and per-position survival.

    The arc and the big figure are this reply's acceptance, the same as its
    Stats…; ticks on it mark the recent (the last rounds, across replies) and
    lifetime averages. Below it, all of this reply: tok/s, speedup over plain
    decoding and k; a bar of where accepted tokens came from (draft model or
    prompt lookup); and bars of how often each draft position survived.
    Colours come from the palette, plus mid-tone accents, so it reads in light
    and dark mode.

    The arc grows with the width, the position chart takes the spare height.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._snapshot: LiveSnapshot | None = None
        # A remote server that reports no acceptance says so, never a guess.
        self.empty_text = EMPTY_TEXT
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setAccessibleName("Speculation gauge")
        self._describe()

    def snapshot(self) -> LiveSnapshot | None:
        """The snapshot on show, if any."""
        return self._snapshot

    def set_snapshot(self, snapshot: LiveSnapshot | None) -> None:
        """Shows ``snapshot`` (``None`` for the empty gauge) at the next paint."""
        self._snapshot = snapshot
        self._describe()
        self.update()  # never repaint synchronously: rounds may arrive quickly

    def summary(self) -> str:
        """The figures on show as one line (also the accessible description)."""
        return summarize(self._snapshot, self.empty_text)

    def _describe(self) -> None:
        text = self.summary()
        self.setAccessibleDescription(text)
        self.setToolTip(text)

    # Layout

    def _fonts(self) -> tuple[QFont, QFont, QFont]:
        """Normal, small and big fonts, derived from the widget's font."""
        normal = QFont(self.font())
        big = _scaled(normal, 2.2)
        big.setBold(True)
        return normal, _scaled(normal, 0.85), big

    @staticmethod
    def _legend_rows(entries: tuple[tuple[str, QColor], ...], width: float, font: QFont) -> int:
        """1 when the entries fit side by side in ``width``, else one row each."""
        metrics = QFontMetricsF(font)
        needed = sum(SWATCH + 4 + metrics.horizontalAdvance(text) for text, _ in entries)
        return 1 if needed + 12 * (len(entries) - 1) <= width else len(entries)

    def _fixed_height(self, width: float) -> float:
        """Height of everything but the arc and the position chart's bars."""
        normal, small, _ = self._fonts()
        line = QFontMetricsF(normal).height()
        small_line = QFontMetricsF(small).height()
        inner = width - 2 * PAD
        sources = max(self._legend_rows(s, inner, small) for s in (SOURCE_LEGEND, HEAD_LEGEND))
        legends = self._legend_rows(TICK_LEGEND, inner, small) + sources
        return (
            small_line  # scale labels under the arc
            + line * 3  # speed, speedup, k
            + small_line + 2 + BAR + 2  # source caption and bar
            + small_line * legends
            + small_line + 2 + 1 + small_line  # chart caption and position labels
            + GAP * 3
            + 2 * PAD
        )  # fmt: skip

    @staticmethod
    def _arc_height(radius: float) -> float:
        """Vertical room of the arc, from the ticks' top to the scale labels."""
        return OVERHANG + STROKE + radius + 2

    @staticmethod
    def _max_radius(width: float) -> float:
        return min(width / 2 - PAD - OVERHANG - STROKE / 2, MAX_RADIUS)

    def sizeHint(self) -> QSize:
        width = 240
        height = self._fixed_height(width) + self._arc_height(self._max_radius(width)) + CHART_HINT
        return QSize(width, math.ceil(height))

    def minimumSizeHint(self) -> QSize:
        width = 200
        height = self._fixed_height(width) + self._arc_height(MIN_RADIUS) + CHART_MIN
        return QSize(width, math.ceil(height))

    # Painting

    def _color(self, role: QPalette.ColorRole) -> QColor:
        return self.palette().color(role)

    def _track(self) -> QColor:
        """Unfilled parts: a faint shade of the text colour over the window."""
        window = self._color(QPalette.ColorRole.Window)
        return _blend(window, self._color(QPalette.ColorRole.WindowText), 0.16)

    def _text(
        self,
        p: QPainter,
        rect: QRectF,
        text: str,
        align: Qt.AlignmentFlag,
        role: QPalette.ColorRole = QPalette.ColorRole.WindowText,
        *,
        wrap: bool = False,
    ) -> None:
        """``text`` in the palette's ``role`` colour, elided to fit ``rect``; with ``wrap``,
        first broken into lines, at up to a fifth smaller, where that fits it whole."""
        p.setPen(self._color(role))
        if wrap:
            font = p.font()
            flags = int(align) | int(Qt.TextFlag.TextWordWrap)
            for scale in (1.0, 0.9, 0.8):
                p.setFont(_scaled(font, scale))
                box = p.fontMetrics().boundingRect(rect.toRect(), flags, text)
                if box.width() <= rect.width() and box.height() <= rect.height():
                    p.drawText(rect, flags, text)
                    return
            p.setFont(font)
        elided = p.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, round(rect.width()))
        p.drawText(rect, align, elided)

    def paintEvent(self, event: QPaintEvent) -> None:
        s = self._snapshot
        normal, small, big = self._fonts()
        line = QFontMetricsF(normal).height()
        small_line = QFontMetricsF(small).height()
        width = self.width() - 2 * PAD
        # The arc takes what the width allows while the chart keeps its minimum.
        spare = self.height() - self._fixed_height(self.width()) - CHART_MIN
        radius = min(self._max_radius(self.width()), spare - self._arc_height(0))
        radius = max(radius, MIN_RADIUS)

        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        center = QPointF(self.width() / 2, PAD + OVERHANG + STROKE / 2 + radius)
        self._paint_arc(p, center, radius, s, big)
        y = PAD + self._arc_height(radius)
        self._paint_scale(p, center, radius, y, small, small_line)
        y += small_line
        if s is not None:
            self._paint_legend(p, y, width, TICK_LEGEND, self._tick_texts(s), small, small_line)
        y += small_line * self._legend_rows(TICK_LEGEND, width, small) + GAP
        if s is None or s.empty:
            p.end()
            return
        y = self._paint_rows(p, y, width, s, normal, line)
        y += GAP
        y = self._paint_sources(p, y, width, s, small, small_line)
        y += GAP
        chart = self.height() - PAD - y - small_line * 2 - 3
        self._paint_positions(
            p, y, width, min(max(chart, CHART_MIN), CHART_MAX), s, small, small_line
        )
        p.end()

    @staticmethod
    def _tick_texts(s: LiveSnapshot) -> tuple[str, str]:
        return (
            f"recent {percent(s.rolling_acceptance)}",
            f"lifetime {percent(s.lifetime_acceptance)}",
        )

    def _paint_arc(
        self,
        p: QPainter,
        center: QPointF,
        radius: float,
        s: LiveSnapshot | None,
        big: QFont,
    ) -> None:
        box = QRectF(center.x() - radius, center.y() - radius, 2 * radius, 2 * radius)
        pen = QPen(self._track(), STROKE)
        pen.setCapStyle(Qt.PenCapStyle.FlatCap)
        p.setPen(pen)
        p.drawArc(box, 180 * 16, -180 * 16)  # Qt angles: 1/16 degree, counter-clockwise
        message = s.message_acceptance if s is not None else None
        if message:
            pen.setColor(self._color(QPalette.ColorRole.Highlight))
            p.setPen(pen)
            p.drawArc(box, 180 * 16, -round(180 * 16 * min(message, 1.0)))
        if s is not None:
            for value, color in (
                (s.lifetime_acceptance, LIFETIME_TICK),
                (s.rolling_acceptance, RECENT_TICK),
            ):
                if value is not None:
                    self._paint_tick(p, center, radius, value, color)
        inside = radius - STROKE
        text_box = QRectF(center.x() - inside, center.y() - inside, 2 * inside, inside)
        bottom = Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom
        if message is None:
            p.setFont(self.font())
            placeholder = QPalette.ColorRole.PlaceholderText
            self._text(p, text_box, self.empty_text, bottom, placeholder, wrap=True)
            return
        # Shrink the big figure to fit inside a small arc.
        metrics = QFontMetricsF(big)
        scale = min(
            text_box.width() * 0.9 / metrics.horizontalAdvance("100%"),
            text_box.height() * 0.8 / metrics.height(),
        )
        p.setFont(_scaled(big, scale) if scale < 1.0 else big)
        self._text(p, text_box, percent(message), bottom)

    def _paint_tick(
        self, p: QPainter, center: QPointF, radius: float, value: float, color: QColor
    ) -> None:
        angle = math.pi * (1.0 - min(max(value, 0.0), 1.0))
        direction = QPointF(math.cos(angle), -math.sin(angle))
        inner = center + direction * (radius - STROKE / 2 - OVERHANG)
        outer = center + direction * (radius + STROKE / 2 + OVERHANG)
        # A window-coloured halo keeps the tick apart from the fill under it.
        for pen_color, pen_width in ((self._color(QPalette.ColorRole.Window), 5), (color, 3)):
            pen = QPen(pen_color, pen_width)
            pen.setCapStyle(Qt.PenCapStyle.RoundCap)
            p.setPen(pen)
            p.drawLine(inner, outer)

    def _paint_scale(
        self,
        p: QPainter,
        center: QPointF,
        radius: float,
        y: float,
        small: QFont,
        small_line: float,
    ) -> None:
        p.setFont(small)
        p.setPen(self._color(QPalette.ColorRole.PlaceholderText))
        left = center.x() - radius - STROKE / 2
        span = 2 * radius + STROKE
        p.drawText(QRectF(left, y, span, small_line), LEFT, "0")
        p.drawText(QRectF(left, y, span, small_line), RIGHT, "100")
        caption = SCALE_CAPTION
        room = span - 2 * p.fontMetrics().horizontalAdvance("100 ")
        if p.fontMetrics().horizontalAdvance(caption) <= room:  # dropped, not elided, if cramped
            p.drawText(QRectF(left, y, span, small_line), CENTER, caption)

    def _paint_legend(
        self,
        p: QPainter,
        y: float,
        width: float,
        layout: tuple[tuple[str, QColor], ...],
        texts: tuple[str, ...],
        small: QFont,
        small_line: float,
    ) -> None:
        """Colour swatches with their texts, side by side or one row each.

        Args:
            layout: Entries with their widest texts, which decide the rows.
            texts: The texts to show, in the same order.
        """
        p.setFont(small)
        stacked = self._legend_rows(layout, width, small) > 1
        slot = width if stacked else width / len(layout)
        for i, ((_, color), text) in enumerate(zip(layout, texts, strict=True)):
            x = PAD if stacked else PAD + i * slot
            top = y + i * small_line if stacked else y
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(color)
            swatch_top = top + (small_line - SWATCH) / 2
            p.drawRoundedRect(QRectF(x, swatch_top, SWATCH, SWATCH), 2, 2)
            self._text(p, QRectF(x + SWATCH + 4, top, slot - SWATCH - 4, small_line), text, LEFT)

    def _paint_rows(
        self, p: QPainter, y: float, width: float, s: LiveSnapshot, normal: QFont, line: float
    ) -> float:
        rows = (
            ("Speed", "—" if s.tps is None else f"{s.tps:.1f} tok/s"),
            ("Speedup", speedup_text(s)),
            ("Draft length", k_text(s)),
        )
        p.setFont(normal)
        for label, value in rows:
            value_width = p.fontMetrics().horizontalAdvance(value)
            # The value wins: the label is elided into what is left.
            label_rect = QRectF(PAD, y, max(width - value_width - 8, 0), line)
            self._text(p, label_rect, label, LEFT, QPalette.ColorRole.PlaceholderText)
            self._text(p, QRectF(PAD, y, width, line), value, RIGHT)
            y += line
        return y

    def _paint_sources(
        self, p: QPainter, y: float, width: float, s: LiveSnapshot, small: QFont, small_line: float
    ) -> float:
        p.setFont(small)
        caption = QRectF(PAD, y, width, small_line)
        self._text(p, caption, "Accepted tokens from", LEFT, QPalette.ColorRole.PlaceholderText)
        y += small_line + 2
        bar = QRectF(PAD, y, width, BAR)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(self._track())
        p.drawRoundedRect(bar, BAR / 2, BAR / 2)
        legend = HEAD_LEGEND if s.own_head else SOURCE_LEGEND  # the drafter by its colour
        share = s.lookup_share
        if share is not None:
            # Clip to the rounded track so the split between the two stays straight.
            rounded = QPainterPath()
            rounded.addRoundedRect(bar, BAR / 2, BAR / 2)
            p.save()
            p.setClipPath(rounded)
            split = width * (1.0 - share)
            p.fillRect(QRectF(bar.left(), y, split, BAR), legend[0][1])
            p.fillRect(QRectF(bar.left() + split, y, width - split, BAR), LOOKUP_SOURCE)
            p.restore()
        y += BAR + 2
        draft_share = None if share is None else 1.0 - share
        drafter = "MTP head" if s.own_head else "draft"
        texts = (f"{drafter} {percent(draft_share)}", f"lookup {percent(share)}")
        self._paint_legend(p, y, width, legend, texts, small, small_line)
        return y + small_line * self._legend_rows(legend, width, small)

    def _paint_positions(
        self,
        p: QPainter,
        y: float,
        width: float,
        height: float,
        s: LiveSnapshot,
        small: QFont,
        small_line: float,
    ) -> None:
        p.setFont(small)
        caption = QRectF(PAD, y, width, small_line)
        placeholder = QPalette.ColorRole.PlaceholderText
        self._text(p, caption, "Acceptance by draft position", LEFT, placeholder)
        y += small_line + 2
        # Positions with data run from 1 without gaps: a round reaching i reached i - 1.
        values = [v for v in s.position_acceptance if v is not None]
        if not values:
            self._text(p, QRectF(PAD, y, width, height), "no drafts yet", CENTER, placeholder)
            return
        slot = min(width / len(values), 24.0)
        left = PAD + (width - slot * len(values)) / 2
        bar_width = max(slot - 4, 2.0)
        p.setPen(Qt.PenStyle.NoPen)
        for i, value in enumerate(values):
            x = left + i * slot + (slot - bar_width) / 2
            p.setBrush(self._track())
            p.drawRect(QRectF(x, y, bar_width, height))
            filled = height * min(max(value, 0.0), 1.0)
            p.setBrush(self._color(QPalette.ColorRole.Highlight))
            p.drawRect(QRectF(x, y + height - filled, bar_width, filled))
        p.setPen(self._color(placeholder))
        for i in range(len(values)):
            label = QRectF(left + i * slot, y + height + 1, slot, small_line)
            p.drawText(label, Qt.AlignmentFlag.AlignHCenter, str(i + 1))
