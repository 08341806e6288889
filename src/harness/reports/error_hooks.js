// src/harness/reports/error_hooks.js — the first script of every page that has one (page.h): any
// error (an uncaught exception, a rejected promise, a blocked fetch) is appended to the body's
// data-errors attribute, where tests/harness/check_html_report.sh looks for it.
(function () {
  'use strict';
  function recordError(message) {
    const body = document.body;
    body.dataset.errors = (body.dataset.errors ? body.dataset.errors + ' | ' : '') + message;
  }
  window.bucketallocRecordError = recordError;
  window.addEventListener('error', function (e) { recordError(String(e.message || e.type)); });
  window.addEventListener('unhandledrejection', function (e) {
    recordError('unhandled rejection: ' + String(e.reason));
  });
  document.addEventListener('securitypolicyviolation', function (e) {
    recordError('blocked by the report\'s content security policy: ' + e.blockedURI);
  });
})();
