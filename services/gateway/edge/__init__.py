"""The gateway's edge: who is calling (auth, sign-in with a provider: oidc, the token cache),
how much (ratelimit), what it costs (metrics) and the middleware every request passes
(middleware: body limits, the request log, security headers), and the sign-in sessions of
people using the console (signins)."""
