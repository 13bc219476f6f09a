"""The training report: PNG charts of every numeric metric and a self-contained HTML page.

At the end of ``fit`` the learner writes it into ``<artifact_dir>/report/`` when
matplotlib is installed (``pip install 'ember[report]'``; ``LearnerBuilder.report(False)``
turns it off); ``ember report ARTIFACT_DIR`` writes it for any artifact directory. See
:mod:`ember.train.report.writer` for the files and :mod:`ember.train.report.collect` for
what is read (and how hostile files are refused).
"""

from ember.train.report.collect import ArtifactFileError, RunData, collect
from ember.train.report.writer import write_report

__all__ = ["ArtifactFileError", "RunData", "collect", "write_report"]
