(function () {
  "use strict";
  var live = document.getElementById("live");
  var badge = document.getElementById("refresh");
  var every = Number(live.getAttribute("data-refresh")) || 2000;
  function show(ok, text) {
    badge.className = "refresh " + (ok ? "live" : "down");
    badge.textContent = text;
  }
  function tick() {
    if (document.hidden) { setTimeout(tick, every); return; }
    var ctl = new AbortController();
    var timer = setTimeout(function () { ctl.abort(); }, 3 * every);
    fetch("ui/live" + location.search, { cache: "no-store", signal: ctl.signal })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        show(true, "live · updated " + new Date().toISOString().slice(11, 19) + " UTC");
      })
      .catch(function (e) { show(false, "agent not answering (" + e.message + "); retrying"); })
      .finally(function () { clearTimeout(timer); setTimeout(tick, every); });
  }
  show(true, "live · every " + every / 1000 + " s");
  setTimeout(tick, every);
})();
