"""The modes a controller runs in (``controller.mode``), by name."""

from liver.controller.live import LiveMode
from liver.controller.mode import Mode
from liver.controller.restart import ForkedRestartMode, RestartMode

MODES: dict[str, type[Mode]] = {m.name: m for m in (LiveMode, RestartMode, ForkedRestartMode)}
