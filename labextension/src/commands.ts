/**
 * The extension's commands. The sidebar's buttons run these too, so each action
 * (confirm and shut down, insert attach code, open the dashboard) lives in one place.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { refreshIcon } from '@jupyterlab/ui-components';

import { errorMessage, hasStatus, ICluster } from './api';
import { usd, usdPerHour } from './format';
import { gpuIcon } from './icons';
import { ClustersModel } from './model';
import { SIDEBAR_ID } from './sidebar';

export namespace CommandIDs {
  export const openSidebar = 'gpugeek:open-sidebar';
  export const refresh = 'gpugeek:refresh';
  export const shutdown = 'gpugeek:shutdown';
  export const insertAttachCode = 'gpugeek:insert-attach-code';
  export const openDashboard = 'gpugeek:open-dashboard';
}

const CATEGORY = 'GPU Geek';

export interface ICommandsOptions {
  app: JupyterFrontEnd;
  model: ClustersModel;
  notebooks: INotebookTracker | null;
  palette: ICommandPalette | null;
}

/** Registers the commands and puts them in the palette (when there is one). */
export function addCommands(options: ICommandsOptions): void {
  const { app, model, notebooks, palette } = options;
  const { commands, shell } = app;

  commands.addCommand(CommandIDs.openSidebar, {
    label: 'Show GPU clusters',
    caption: 'Open the GPU clusters sidebar',
    icon: args => (args.isPalette ? undefined : gpuIcon),
    execute: () => shell.activateById(SIDEBAR_ID)
  });

  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh GPU clusters',
    icon: args => (args.isPalette ? undefined : refreshIcon),
    execute: () => model.refresh()
  });

  commands.addCommand(CommandIDs.shutdown, {
    label: args => (args.name ? `Shut down GPU cluster ${args.name}` : 'Shut down a GPU cluster…'),
    caption: 'Stop a live cluster and every node it is billed for (an attached one: detach)',
    execute: async args => {
      const cluster = await Private.resolve(model, args, 'Shut down which GPU cluster?');
      if (cluster) {
        await Private.shutdown(model, cluster);
      }
    }
  });

  commands.addCommand(CommandIDs.insertAttachCode, {
    label: args =>
      args.name ? `Insert attach code for ${args.name}` : 'Insert GPU cluster attach code…',
    caption: 'Insert a cell below the active one that attaches the kernel to a cluster',
    execute: async args => {
      const panel = notebooks?.currentWidget ?? null;
      if (!panel) {
        Notification.warning(
          'Open a notebook first: the attach code goes in a new cell below its active cell.',
          { autoClose: 6000 }
        );
        return;
      }
      const cluster = await Private.resolve(model, args, 'Attach the notebook to which cluster?');
      if (!cluster) {
        return;
      }
      const notebook = panel.content;
      const cells = notebook.model?.sharedModel;
      if (!cells) {
        return;
      }
      const index = notebook.activeCell ? notebook.activeCellIndex + 1 : cells.cells.length;
      cells.insertCell(index, { cell_type: 'code', source: cluster.attach_code, metadata: {} });
      notebook.activeCellIndex = index;
      notebook.mode = 'command';
      shell.activateById(panel.id);
      Notification.info(`Attach code for ${cluster.name} inserted: run the cell to attach.`, {
        autoClose: 4000
      });
    }
  });

  commands.addCommand(CommandIDs.openDashboard, {
    label: args => (args.name ? `Open Ray dashboard of ${args.name}` : 'Open a Ray dashboard…'),
    caption: "Open a cluster's Ray dashboard in a new browser tab",
    execute: async args => {
      const cluster = await Private.resolve(model, args, 'Open the dashboard of which cluster?');
      if (!cluster) {
        return;
      }
      if (!cluster.dashboard_url) {
        Notification.warning(`${cluster.name} was started without Ray's dashboard.`, {
          autoClose: 6000
        });
        return;
      }
      window.open(cluster.dashboard_url, '_blank', 'noopener');
    }
  });

  if (palette) {
    for (const command of Object.values(CommandIDs)) {
      palette.addItem({ command, category: CATEGORY });
    }
  }
}

namespace Private {
  /**
   * The cluster a command is about: its `name` argument (with `id`, that run of it; without,
   * the live one of that name, else its latest), or else the only live cluster, or else the
   * one the user picks. Null (after telling the user why) when none.
   */
  export async function resolve(
    model: ClustersModel,
    args: { readonly name?: unknown; readonly id?: unknown },
    question: string
  ): Promise<ICluster | null> {
    const name = typeof args.name === 'string' ? args.name : '';
    const id = typeof args.id === 'number' ? args.id : undefined;
    if (name) {
      const known = id === undefined ? model.find(name) : model.findById(id);
      if (known && known.name === name) {
        return known;
      }
      try {
        return await model.detail(name, id);
      } catch (error) {
        Notification.error(`gpugeek: ${errorMessage(error)}`, { autoClose: 8000 });
        return null;
      }
    }
    if (model.list === null) {
      await model.refresh();
    }
    const live = model.live;
    if (live.length === 0) {
      Notification.info(
        model.error
          ? `gpugeek: ${model.error}`
          : 'No live GPU clusters. Start one with %gpugeek up.',
        { autoClose: 5000 }
      );
      return null;
    }
    if (live.length === 1) {
      return live[0];
    }
    const picked = await InputDialog.getItem({
      title: question,
      items: live.map(c => c.name),
      okLabel: 'Choose'
    });
    return picked.button.accept && picked.value ? (model.find(picked.value) ?? null) : null;
  }

  /**
   * Confirms, stops (an `attach` cluster: detaches), and reports the final cost. The server
   * has the last word: a 409 (still starting, already stopped) shows its reason as a warning.
   */
  export async function shutdown(model: ClustersModel, cluster: ICluster): Promise<void> {
    if (!cluster.live) {
      Notification.info(`${cluster.name} is already stopped.`, { autoClose: 4000 });
      return;
    }
    if (model.isStopping(cluster.id)) {
      return;
    }
    const detach = cluster.detaches;
    const answer = await showDialog(detach ? detachDialog(cluster) : shutdownDialog(cluster));
    if (!answer.button.accept) {
      return;
    }
    const verb = detach ? 'detach from' : 'shut down';
    try {
      const result = await model.stop(cluster);
      const final = `${usd(result.spent_usd)}${result.simulated ? ' (simulated)' : ''}`;
      Notification.success(
        `${detach ? 'Detached from' : 'Shut down'} ${result.name}: final cost ${final}.`,
        { autoClose: 8000 }
      );
    } catch (error) {
      if (hasStatus(error, 409)) {
        // model.stop has already asked for a fresh list: the card shows the state the server has
        Notification.warning(errorMessage(error), { autoClose: 8000 });
      } else {
        Notification.error(`Could not ${verb} ${cluster.name}: ${errorMessage(error)}`, {
          autoClose: false
        });
      }
    }
  }

  function shutdownDialog(cluster: ICluster): Partial<Dialog.IOptions<unknown>> {
    const sim = cluster.simulated ? ' (simulated)' : '';
    const starting =
      cluster.state === 'starting'
        ? ' It is still starting: the server refuses until its %gpugeek up has finished.'
        : '';
    return {
      title: `Shut down ${cluster.name}?`,
      body:
        `${cluster.name} (${cluster.backend}) costs ${usdPerHour(cluster.usd_per_hour)}${sim} ` +
        `and has cost ${usd(cluster.spent_usd)} so far. Shutting it down stops its running ` +
        `jobs and all its nodes.${starting}`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut down' })]
    };
  }

  function detachDialog(cluster: ICluster): Partial<Dialog.IOptions<unknown>> {
    const at = cluster.address ? ` at ${cluster.address}` : '';
    return {
      title: `Detach from ${cluster.name}?`,
      body:
        `${cluster.name} is a Ray cluster${at} that gpugeek attached to, not one it started. ` +
        "Detaching only drops this notebook's link to it: nothing is stopped, and the " +
        'cluster and its jobs keep running.',
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Detach' })]
    };
  }
}
