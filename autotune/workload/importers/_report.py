"""What an import read and what it dropped, and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ImportReport:
    """Counts of what was read and of what was dropped or adjusted, by reason."""

    source: str
    read: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    adjusted: Counter[str] = field(default_factory=Counter)

    def lines(self) -> list[str]:
        """Human-readable summary lines."""
        read = ", ".join(f"{count} {what}" for what, count in self.read.items()) or "nothing"
        out = [f"read from {self.source}: {read}"]
        if self.dropped:
            out.append(f"dropped {sum(self.dropped.values())}:")
            out.extend(f"  {count} x {reason}" for reason, count in self.dropped.most_common())
        else:
            out.append("dropped nothing")
        if self.adjusted:
            out.append(f"adjusted {sum(self.adjusted.values())}:")
            out.extend(f"  {count} x {reason}" for reason, count in self.adjusted.most_common())
        return out
