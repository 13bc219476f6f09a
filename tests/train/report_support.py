"""Shared by the report tests: a short fit that writes a report, and a strict HTML reader."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from learner_support import CallbackRenderer, classifier, loaders

from ember.optim.adam import AdamConfig
from ember.train.learner.builder import LearnerBuilder
from ember.train.learner.learner import Learner
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.loss import LossMetric

EPOCHS = 2
METRICS = ("Loss", "Accuracy")
TRAIN_COLOR, VALID_COLOR = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # plots.COLORS


def short_fit(artifact: Path, *, report: bool = True, checkpoints: bool = True) -> Learner:
    """Two epochs of the tiny classifier (6 training and 2 validation batches each)."""
    builder = (LearnerBuilder(artifact).num_epochs(EPOCHS).renderer(CallbackRenderer())
               .metric_train_numeric(LossMetric()).metric_valid_numeric(LossMetric())
               .metric_train_numeric(AccuracyMetric()).metric_valid_numeric(AccuracyMetric())
               .report(report))  # fmt: skip
    if checkpoints:
        builder = builder.with_file_checkpointer()
    learner = builder.build(classifier(3), AdamConfig().init(), 0.05)
    learner.fit(*loaders())
    return learner


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}  # fmt: skip


class StrictPage(HTMLParser):
    """Parses a page, failing on an unclosed, stray or misnested tag; keeps the tags (with
    their attributes) and the text of each element kind."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, list[str]] = {}
        self.feed(text)
        self.close()
        assert not self.open, f"unclosed tags: {self.open}"

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        if self.open:
            self.text.setdefault(self.open[-1], []).append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]
