"""Modules: typed parameter containers, their parameters and their records."""

from ember.module.module import Module
from ember.module.param import Param, ParamId, RunningState
from ember.module.record import LoadReport

__all__ = ["LoadReport", "Module", "Param", "ParamId", "RunningState"]
