"""The controller of each ``controller.mode``."""

from liver.controller.live import LiveController
from liver.controller.restart import ForkedRestartController, RestartController

CONTROLLERS = {"live": LiveController, "restart": RestartController, "restart-forked": ForkedRestartController}
