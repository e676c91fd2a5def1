"""What a bench section measured, skipped and failed, kept so that nothing stops a run.

Each measurement is one `Section.item`: it runs only if the time budget still holds
the longest item seen so far in the section, an exception in it is recorded (type,
message, the innermost frames) instead of ending the run, and every row is printed
and saved as it arrives, so a run killed at its time limit keeps its rows.
"""

import time
import traceback


class Section:
    def __init__(self, name: str, budget, save, format_row):
        """name: the section; budget: a `_timing.Budget`; save(): writes the run's
        results file; format_row(row) -> str: one printed line per row."""
        self.name, self.budget, self.save, self.format_row = name, budget, save, format_row
        self.rows, self.skipped, self.errors, self.notes = [], [], [], []
        self.seconds = 0.0
        self._longest = 0.0

    def item(self, what: str, measure):
        """Run `measure()`, which returns a list of rows; None if skipped or failed."""
        if not self.budget.fits(self._longest):
            self.skip(
                what,
                f"time budget: {self.budget.left():.0f} s left, items take up to "
                f"{self._longest:.0f} s",
            )
            return None
        start = time.monotonic()
        try:
            rows = measure()
        except Exception as e:  # noqa: BLE001 - a failing measurement is a result, the run goes on
            self.fail(what, e)
            rows = None
        finally:
            spent = time.monotonic() - start
            self._longest = max(self._longest, spent)
            self.seconds += spent
        for row in rows or ():
            self.add(row)
        return rows

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.save()
        try:
            line = self.format_row(row)
        except Exception as e:  # noqa: BLE001 - a measured row outlives a bug in its printing
            line = f"{row} (format_row: {type(e).__name__}: {e})"
        print(f"[{self.name}] {line}", flush=True)

    def skip(self, what: str, why: str) -> None:
        self.skipped.append({"item": what, "why": why})
        print(f"[{self.name}] skipped {what}: {why}", flush=True)
        self.save()

    def fail(self, what: str, error: BaseException) -> None:
        frames = traceback.extract_tb(error.__traceback__)[-3:]
        self.errors.append(
            {
                "item": what,
                "error": f"{type(error).__name__}: {error}"[:2000],
                "where": [f"{f.filename}:{f.lineno} {f.name}" for f in frames],
            }
        )
        print(f"[{self.name}] FAILED {what}: {type(error).__name__}: {error}"[:600], flush=True)
        self.save()

    def note(self, text: str) -> None:
        """A fact about the section's numbers a reader needs (emulated paths, say)."""
        if text not in self.notes:
            self.notes.append(text)

    def as_dict(self) -> dict:
        return {
            "rows": self.rows,
            "skipped": self.skipped,
            "errors": self.errors,
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
        }
