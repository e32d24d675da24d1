"""The one rule for telling a finding (notify.tell): hooks and webhooks hear of a code once and
again when its severity changes; browsers get every change."""

from __future__ import annotations

import pytest

from gradwatch_server.notify import Told, tell

pytestmark = pytest.mark.unit


def finding(severity: str, message: str) -> dict[str, object]:
    return {"code": "amp_skipped_steps", "severity": severity, "message": message, "first_step": 3}


def test_a_finding_is_news_once_again_when_graver_and_every_change_reaches_browsers() -> None:
    known: dict[str, dict[str, object]] = {}
    assert tell(known, finding("info", "1 skipped")) == Told(changed=True, news=True)
    assert tell(known, finding("info", "1 skipped")) == Told(changed=False, news=False)
    assert tell(known, finding("info", "2 skipped")) == Told(changed=True, news=False)
    assert tell(known, finding("warning", "9 skipped")) == Told(changed=True, news=True)
    assert known["amp_skipped_steps"]["severity"] == "warning"
    assert tell(known, {**finding("info", "x"), "code": "other"}).news  # codes are told apart
