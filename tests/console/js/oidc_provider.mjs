// A real OpenID Connect provider for the tests of the console's sign-in (issue 45): the npm
// `oidc-provider` (a certified implementation), with one static confidential client, the test
// users and their `groups` claim, PKCE required, a plain sign-in form that checks each
// user's password, and RP-Initiated Logout (its end_session_endpoint, with a plain confirmation
// page: "Yes, sign me out" #logout-yes, "No, stay signed in" #logout-no). tests/console/oidc.py installs the package, makes the signing keys and
// starts this with a JSON config file:
//   node oidc_provider.mjs CONFIG.json
// CONFIG: {node_modules, port, issuer, client_id, client_secret, redirect_uris,
//          post_logout_redirect_uris, keys (private JWKs; the first signs), cookie_key, accounts: {login: {password, claims}}}
// It prints "ready <issuer>" once it listens.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import querystring from "node:querystring";
import { pathToFileURL } from "node:url";

const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
// ESM ignores NODE_PATH: the package is imported from where the tests installed it.
const entry = path.join(cfg.node_modules, "oidc-provider", "lib", "index.js");
const { default: Provider } = await import(pathToFileURL(entry).href);

const accounts = cfg.accounts;
const escape = (text) =>
  String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const configuration = {
  clients: [
    {
      client_id: cfg.client_id,
      client_secret: cfg.client_secret,
      redirect_uris: cfg.redirect_uris,
      post_logout_redirect_uris: cfg.post_logout_redirect_uris || [],
      response_types: ["code"],
      grant_types: ["authorization_code"],
      token_endpoint_auth_method: "client_secret_basic",
    },
  ],
  jwks: { keys: cfg.keys },
  cookies: {
    keys: [cfg.cookie_key],
    // Plain HTTP on loopback: SameSite=None cookies would need Secure, which browsers drop.
    long: { sameSite: "lax" },
    short: { sameSite: "lax" },
  },
  pkce: { required: () => true, methods: ["S256"] },
  scopes: ["openid", "profile", "email", "groups"],
  claims: {
    openid: ["sub"],
    profile: ["preferred_username", "name"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  features: {
    devInteractions: { enabled: false },
    // The default pages import a web font from the internet; these hold nothing from elsewhere.
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        ctx.type = "html";
        ctx.body = `<!doctype html><html><head><title>Test provider sign-out</title></head><body>
<h1>Sign out of the test provider?</h1>${form}
<button type="submit" form="op.logoutForm" value="yes" name="logout" id="logout-yes">Yes, sign me out</button>
<button type="submit" form="op.logoutForm" id="logout-no">No, stay signed in</button></body></html>`;
      },
      async postLogoutSuccessSource(ctx) {
        ctx.type = "html";
        ctx.body = `<!doctype html><h1 id="signed-out">Signed out of the test provider</h1>`;
      },
    },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    if (!Object.hasOwn(accounts, id)) return undefined;
    return { accountId: id, claims: async () => ({ sub: id, ...accounts[id].claims }) };
  },
  // A first-party client: the scopes it asks for are granted without a consent screen.
  async loadExistingGrant(ctx) {
    const grantId =
      ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope("openid profile email groups");
    await grant.save();
    return grant;
  },
  async renderError(ctx, out) {
    ctx.type = "html";
    ctx.body = `<!doctype html><h1>Sign-in error</h1><p id="error">${escape(out.error)}: ${escape(
      out.error_description || "",
    )}</p>`;
  },
};

const provider = new Provider(cfg.issuer, configuration);

function signInPage(uid, problem) {
  return `<!doctype html><html><head><title>Test provider sign-in</title></head><body>
<h1>Test provider</h1>${problem ? `<p id="problem">${escape(problem)}</p>` : ""}
<form method="post" action="/interaction/${escape(uid)}">
<label>Login <input name="login" id="login" autocomplete="off"></label>
<label>Password <input name="password" id="password" type="password"></label>
<button type="submit" id="submit">Sign in</button></form></body></html>`;
}

async function readForm(req) {
  let raw = "";
  for await (const chunk of req) {
    raw += chunk;
    if (raw.length > 8192) throw new Error("form too large");
  }
  return querystring.parse(raw);
}

// The sign-in interaction: a form whose password is checked against the test users.
provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([A-Za-z0-9_-]+)$/);
  if (!match) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.uid !== match[1] || details.prompt.name !== "login") ctx.throw(400, "no such sign-in");
  if (ctx.method === "GET") {
    ctx.type = "html";
    ctx.body = signInPage(details.uid);
    return undefined;
  }
  if (ctx.method !== "POST") ctx.throw(405);
  const form = await readForm(ctx.req);
  const login = String(form.login || "");
  const known = Object.hasOwn(accounts, login) ? accounts[login] : null;
  if (!known || known.password !== String(form.password || "")) {
    ctx.status = 401;
    ctx.type = "html";
    ctx.body = signInPage(details.uid, "Wrong login or password.");
    return undefined;
  }
  // Ends the response itself: a 303 back to the authorization.
  return provider.interactionFinished(
    ctx.req,
    ctx.res,
    { login: { accountId: login } },
    { mergeWithLastSubmission: false },
  );
});

// Loopback only, on IPv4 and (when the host has it) IPv6: `localhost` may resolve to either.
const handler = provider.callback();
const servers = ["127.0.0.1", "::1"].map((host) => {
  const server = http.createServer(handler);
  server.on("error", (error) => {
    if (host === "127.0.0.1") throw error;
  });
  server.listen(cfg.port, host);
  return server;
});
servers[0].on("listening", () => console.log(`ready ${cfg.issuer}`));
process.on("SIGTERM", () => process.exit(0));
