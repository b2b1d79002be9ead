// A small real OpenID Connect provider for the sign-in tests: panva's oidc-provider (a
// certified implementation) on 127.0.0.1, one static confidential client, and a test
// interaction that logs in the current test user without a form and grants what is asked.
//
//   node oidc_provider.mjs REDIRECT_URI CLIENT_SECRET [ALG]
//
// Prints one JSON line {"issuer": ...} once listening. The test user is set with
// POST /_test/user?sub=...&email=...&verified=true|false&groups=a,b (sub "deny": the
// provider answers access_denied). ALG: the ID token's signature (RS256, default, or ES256).
import http from 'node:http';
import { generateKeyPairSync } from 'node:crypto';
import Provider from 'oidc-provider';

const [redirectUri, clientSecret, alg = 'RS256'] = process.argv.slice(2);
const jwk = (pair, kid, use) => ({ ...pair.publicKey.export({ format: 'jwk' }), ...pair.privateKey.export({ format: 'jwk' }), kid, use });
const rsa = jwk(generateKeyPairSync('rsa', { modulusLength: 2048 }), 'rsa-1', 'sig');
const ecKey = jwk(generateKeyPairSync('ec', { namedCurve: 'P-256' }), 'ec-1', 'sig');

let user = { sub: 'alice-sub', email: 'alice@example.com', email_verified: true, groups: [] };

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [{
      client_id: 'gateway',
      client_secret: clientSecret,
      redirect_uris: [redirectUri],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      id_token_signed_response_alg: alg,
    }],
    jwks: { keys: [rsa, ecKey] },
    claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
    scopes: ['openid', 'email', 'groups'],
    conformIdTokenClaims: false, // the scope's claims in the ID token itself
    findAccount: (ctx, id) => ({ accountId: id, claims: () => ({ ...user, sub: id }) }),
    features: { devInteractions: { enabled: false } },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    cookies: { keys: ['test-cookie-key'] },
    pkce: { required: () => true },
  });
  const callback = provider.callback();

  async function interaction(req, res) {
    const details = await provider.interactionDetails(req, res);
    if (user.sub === 'deny') {
      return provider.interactionFinished(req, res, { error: 'access_denied' }, { mergeWithLastSubmission: false });
    }
    if (details.prompt.name === 'login') {
      return provider.interactionFinished(req, res, { login: { accountId: user.sub } }, { mergeWithLastSubmission: false });
    }
    const d = details.prompt.details;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    if (d.missingOIDCScope) grant.addOIDCScope(d.missingOIDCScope.join(' '));
    if (d.missingOIDCClaims) grant.addOIDCClaims(d.missingOIDCClaims);
    return provider.interactionFinished(req, res, { consent: { grantId: await grant.save() } }, { mergeWithLastSubmission: true });
  }

  server.on('request', (req, res) => {
    const url = new URL(req.url, issuer);
    if (url.pathname === '/_test/user' && req.method === 'POST') {
      const q = url.searchParams;
      user = {
        sub: q.get('sub') || 'alice-sub',
        email: q.get('email') || 'alice@example.com',
        email_verified: q.get('verified') !== 'false',
        groups: (q.get('groups') || '').split(',').filter(Boolean),
      };
      res.end('ok');
      return;
    }
    if (url.pathname.startsWith('/interaction/')) {
      interaction(req, res).catch((e) => { res.statusCode = 500; res.end(String(e)); });
      return;
    }
    callback(req, res);
  });
  console.log(JSON.stringify({ issuer }));
});
