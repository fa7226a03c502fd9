import { defineRoute, openApiDocument, openApiPath, type RouteDefinition } from '../route.ts';

export const API_TITLE = 'Payments API';
export const API_VERSION = '0.0.1';

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}

/** `/openapi.json` generated from the route definitions, and `/docs`, a page that lists them. */
export function docsRoutes(routes: () => readonly RouteDefinition[]): RouteDefinition[] {
  const document = () => openApiDocument(routes(), { title: API_TITLE, version: API_VERSION });
  return [
    defineRoute({
      method: 'GET',
      path: '/openapi.json',
      operationId: 'getOpenApi',
      summary: 'The OpenAPI 3.1 description of this API, generated from its route definitions.',
      tags: ['docs'],
      auth: { kind: 'public' },
      responses: { 200: 'OpenAPI document.' },
      handler(ctx) {
        ctx.body = document();
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/docs',
      operationId: 'getDocs',
      summary: 'Human-readable list of every operation.',
      tags: ['docs'],
      auth: { kind: 'public' },
      responses: { 200: 'HTML page.' },
      handler(ctx) {
        const rows = routes()
          .map(
            (route) =>
              `<tr><td><code>${route.method}</code></td><td><code>${escapeHtml(openApiPath(route.path))}</code></td>` +
              `<td>${escapeHtml(route.summary)}</td></tr>`,
          )
          .join('\n');
        ctx.type = 'text/html; charset=utf-8';
        ctx.body =
          `<!doctype html><html><head><meta charset="utf-8"><title>${API_TITLE}</title></head><body>` +
          `<h1>${API_TITLE} ${API_VERSION}</h1><p>Machine-readable: <a href="/openapi.json">/openapi.json</a></p>` +
          `<table><thead><tr><th>Method</th><th>Path</th><th>Summary</th></tr></thead><tbody>${rows}</tbody></table>` +
          `</body></html>`;
      },
    }),
  ];
}
