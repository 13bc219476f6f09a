"""The full-screen training dashboard: live plots, progress and metrics in the terminal.

``DashboardRenderer`` is the :class:`~ember.train.renderer.base.MetricsRenderer` the
learner uses when stdout is a terminal; ``DashboardApp`` is its textual screen and
``DashboardState`` the thread-safe store between them.
``ember.train.renderer.dashboard.capture`` draws a sample run as text.
"""

from ember.train.renderer.dashboard.app import DashboardApp
from ember.train.renderer.dashboard.chart import LineChart, Series
from ember.train.renderer.dashboard.renderer import DashboardRenderer
from ember.train.renderer.dashboard.state import DashboardState, DashboardView, MetricHistory

__all__ = [
    "DashboardApp", "DashboardRenderer", "DashboardState", "DashboardView", "LineChart",
    "MetricHistory", "Series",
]  # fmt: skip
