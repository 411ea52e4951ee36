"""Terminal UI (Textual) over the analysis results."""

from fsdpdoctor.tui.app import FsdpDoctorApp

__all__ = ["FsdpDoctorApp"]
