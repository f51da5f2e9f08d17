/**
 * gpugeek-jupyter: a status-bar cost ticker and a GPU clusters sidebar for the
 * Ray clusters that gpugeek_jupyter starts. Wiring only; each part has its module.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { GpugeekApi } from './api';
import { addCommands, CommandIDs } from './commands';
import { ClustersModel, DEFAULT_POLL, IPollSettings } from './model';
import { ClustersSidebar } from './sidebar';
import { ClustersStatus } from './statusbar';

const PLUGIN_ID = 'gpugeek-jupyter:plugin';

/** Reads the poll timing from the settings, falling back to the defaults. */
function pollSettings(settings: ISettingRegistry.ISettings): IPollSettings {
  const read = (key: keyof IPollSettings): number => {
    const value = settings.get(key).composite;
    return typeof value === 'number' && value > 0 ? value : DEFAULT_POLL[key];
  };
  return { pollInterval: read('pollInterval'), maxBackoff: read('maxBackoff') };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Status-bar cost ticker and sidebar for gpugeek Ray GPU clusters.',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer, INotebookTracker, ISettingRegistry, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    notebooks: INotebookTracker | null,
    registry: ISettingRegistry | null,
    statusBar: IStatusBar | null
  ): void => {
    const model = new ClustersModel(new GpugeekApi());

    addCommands({ app, model, notebooks, palette });

    const sidebar = new ClustersSidebar({
      model,
      refresh: () => void app.commands.execute(CommandIDs.refresh),
      actions: {
        shutdown: (name, id) => void app.commands.execute(CommandIDs.shutdown, { name, id }),
        openDashboard: (name, id) =>
          void app.commands.execute(CommandIDs.openDashboard, { name, id }),
        insertAttach: (name, id) =>
          void app.commands.execute(CommandIDs.insertAttachCode, { name, id })
      }
    });
    app.shell.add(sidebar, 'left', { rank: 850 });
    restorer?.add(sidebar, sidebar.id);

    statusBar?.registerStatusItem(`${PLUGIN_ID}:status`, {
      item: new ClustersStatus(model, () => void app.commands.execute(CommandIDs.openSidebar)),
      align: 'left',
      rank: 50
    });

    const settingsLoaded = registry
      ? registry.load(PLUGIN_ID).then(settings => {
          model.configure(pollSettings(settings));
          settings.changed.connect(() => model.configure(pollSettings(settings)));
        })
      : Promise.resolve();
    settingsLoaded
      .catch(error => console.warn(`${PLUGIN_ID}: settings not loaded, using defaults`, error))
      .finally(() => void model.start());
  }
};

export default plugin;
