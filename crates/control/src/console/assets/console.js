// Tollgate's console: the only script. It reloads the overview's chart every five seconds;
// every page works without it.
"use strict";
(function () {
  var chart = document.getElementById("chart");
  if (!chart) {
    return;
  }
  setInterval(function () {
    if (document.visibilityState === "visible") {
      chart.src = "/console/chart.svg?t=" + Date.now();
    }
  }, 5000);
})();
