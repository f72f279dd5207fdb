"""systemd's notify protocol (`Type=notify`, `WatchdogSec=`): a datagram to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


class SystemdNotifier:
    """Sends `READY=1`, `WATCHDOG=1`, `STOPPING=1`, `STATUS=...`; does nothing outside systemd."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # an abstract socket
            address = "\0" + address[1:]
        self.address = address
        self._sock: socket.socket | None = None
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    @staticmethod
    def watchdog_interval_s() -> float | None:
        """Half of systemd's WatchdogSec (given as $WATCHDOG_USEC), or None without a watchdog."""
        usec = os.environ.get("WATCHDOG_USEC")
        return int(usec) / 2e6 if usec and usec.isdigit() else None

    def notify(self, *states: str) -> bool:
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(states).encode(), self.address)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
