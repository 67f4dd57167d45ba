// Definitions: download (GET /api/definitions) and upload (POST /api/definitions).

import { api } from '../api.js';
import { attempt, field, form, h, notify, section } from '../dom.js';

export async function mount(main) {
  main.append(h('h1', {}, 'Definitions'),
    section('Export', h('p', {}, 'Users, virtual hosts, permissions, policies, exchanges, queues and bindings as RabbitMQ\'s definitions JSON.'),
      h('button', {
        type: 'button', id: 'download-definitions',
        onclick: async () => {
          const defs = await attempt('Exporting definitions', () => api('GET', 'definitions'));
          if (defs === undefined) return;
          const blob = new Blob([JSON.stringify(defs, null, 2)], { type: 'application/json' });
          const url = URL.createObjectURL(blob);
          const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, '-');
          const a = h('a', { href: url, download: `warren-definitions-${stamp}.json` });
          document.body.append(a);
          a.click();
          a.remove();
          setTimeout(() => URL.revokeObjectURL(url), 10000);
        },
      }, 'Download broker definitions')),
    section('Import', form({ id: 'upload-definitions' }, async (f) => {
      const file = f.elements.file.files[0];
      if (!file) return;
      let defs;
      try {
        defs = JSON.parse(await file.text());
      } catch (e) {
        notify(`${file.name} is not JSON: ${e.message}`, 'error');
        return;
      }
      const ok = await attempt('Importing definitions', () => api('POST', 'definitions', defs).then(() => true));
      if (ok) {
        notify(`Definitions from ${file.name} imported.`);
        f.reset();
      }
    },
    field('Definitions file', h('input', { name: 'file', type: 'file', accept: '.json,application/json', required: true })),
    h('button', { type: 'submit' }, 'Upload broker definitions'))));
  return null;
}
