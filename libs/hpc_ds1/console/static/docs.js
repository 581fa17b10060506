// Starts Swagger UI on /docs (services/gateway/console.py). A file, not an inline script: the
// Content-Security-Policy of every page (script-src 'self') refuses inline scripts.
(function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  // eslint-disable-next-line no-undef
  window.ui = SwaggerUIBundle({
    url: root.getAttribute("data-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    // No validator badge: it is an image from validator.swagger.io.
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
})();
